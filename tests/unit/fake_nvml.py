"""A fake `pynvml` module: the NVML hardware boundary for CPU-only tests. It implements the calls
the sidecar makes with fixed, distinguishable values per device, can raise like the real binding
(NotSupported, LibraryNotFound, Timeout) and can leave functions out (old drivers / bindings)."""

from __future__ import annotations

import types
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


def make(
    count: int = 2,
    missing: tuple[str, ...] = (),
    lib_missing: bool = False,
    xids: list[tuple[int, int]] | None = None,
) -> types.ModuleType:
    """count GPUs; `missing` function names are absent; `xids` are (device index, xid) pending."""
    m = types.ModuleType("fake_pynvml")
    calls: dict[str, int] = {}
    pending = list(xids or [])
    nvlink = {"n": 0}
    consts = dict(
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX=138,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX=139,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlEventTypeXidCriticalError=8,
        nvmlClocksEventReasonGpuIdle=1,
        nvmlClocksEventReasonSwPowerCap=4,
        nvmlClocksEventReasonHwSlowdown=8,
    )
    for k, v in consts.items():
        setattr(m, k, v)
    for cls in (NVMLError, NVMLError_LibraryNotFound, NVMLError_NotSupported, NVMLError_Timeout):
        setattr(m, cls.__name__, cls)

    def init() -> None:
        if lib_missing:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def ns(**kw: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(**kw)

    def field_values(h: int, ids: list[int]) -> list[Any]:
        nvlink["n"] += 1
        return [
            ns(nvmlReturn=0, value=ns(ullVal=nvlink["n"] * 1000 * (i + 1) * (h + 1)))
            for i, _ in enumerate(ids)
        ]

    def ecc(h: int, *_: Any) -> int:
        if h == 1:
            raise NVMLError_NotSupported("Not Supported")
        return 0

    def wait(es: Any, timeout_ms: int) -> Any:
        if not pending:
            raise NVMLError_Timeout("Timeout")
        idx, xid = pending.pop(0)
        return ns(device=idx, eventData=xid, eventType=8)

    fns = dict(
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: f"Fake H{h}00",
        nvmlDeviceGetUtilizationRates=lambda h: ns(gpu=50 + h, memory=10),
        nvmlDeviceGetMemoryInfo=lambda h: ns(used=(h + 1) * 2**30, total=80 * 2**30, free=0),
        nvmlDeviceGetPowerUsage=lambda h: 300_500 + h,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980 if kind == 1 else 2619,
        nvmlDeviceGetTemperature=lambda h, kind: 60 + h,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 4 | 8 if h == 0 else 1,
        nvmlDeviceGetPcieThroughput=lambda h, kind: 100 + kind,
        nvmlDeviceGetFieldValues=field_values,
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlEventSetCreate=lambda: "es",
        nvmlDeviceRegisterEvents=lambda h, kind, es: None,
        nvmlEventSetWait_v2=wait,
        nvmlEventSetFree=lambda es: None,
    )
    for name, fn in fns.items():
        if name not in missing:

            def counted(*a: Any, _fn: Any = fn, _name: str = name) -> Any:
                calls[_name] = calls.get(_name, 0) + 1
                return _fn(*a)

            setattr(m, name, counted)
    m.calls = calls  # type: ignore[attr-defined]
    return m
