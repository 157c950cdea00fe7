"""Read one GPU's health through the `Nvml` seam: the fields of `schema.GPU`, NA where unsupported.

Units: memory bytes, power W, clocks MHz, temperature C, PCIe and NVLink bytes/s; `throttle` is the
list of active clock-event reason names; `xid` the Xid errors reported since the previous sample.
"""

from __future__ import annotations

import time
from typing import Any

from diag.nvml.seam import NA, Nvml, value

# reason bit -> name, resolved against the binding (the "Throttle" names became "ClocksEvent")
_REASONS = (
    "GpuIdle",
    "ApplicationsClocksSetting",
    "SwPowerCap",
    "HwSlowdown",
    "SyncBoost",
    "SwThermalSlowdown",
    "HwThermalSlowdown",
    "HwPowerBrakeSlowdown",
    "DisplayClockSetting",
)
# reasons that mean the GPU is being held back (the UI marks them)
SERIOUS = frozenset(
    {"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown", "SwPowerCap"}
)


def throttle_names(nv: Nvml, mask: Any) -> Any:
    if mask is NA:
        return NA
    out = []
    for name in _REASONS:
        bit = nv.const(f"nvmlClocksEventReason{name}", f"nvmlClocksThrottleReason{name}")
        if bit is not NA and mask & bit:
            out.append(name)
    return out


class GpuReader:
    """Samples one device; remembers NVLink counters to turn them into rates."""

    def __init__(self, nv: Nvml, index: int) -> None:
        self.nv, self.index = nv, index
        self.handle = nv.query("nvmlDeviceGetHandleByIndex", index)
        self.name = value(nv.query("nvmlDeviceGetName", self.handle))
        self._nvlink_prev: tuple[float, int, int] | None = None

    def sample(self, xids: list[int] | None = None) -> dict[str, Any]:
        nv, h = self.nv, self.handle
        util = nv.query("nvmlDeviceGetUtilizationRates", h)
        mem = nv.query("nvmlDeviceGetMemoryInfo", h)
        power = nv.query("nvmlDeviceGetPowerUsage", h)
        limit = nv.query("nvmlDeviceGetEnforcedPowerLimit", h)
        mask = nv.query("nvmlDeviceGetCurrentClocksEventReasons", h, default=NA)
        if mask is NA:
            mask = nv.query("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        tx, rx = self._nvlink()
        rec = {
            "k": "gpu",
            "ts": time.time_ns(),
            "index": self.index,
            "util": getattr(util, "gpu", NA),
            "mem_used": getattr(mem, "used", NA),
            "mem_total": getattr(mem, "total", NA),
            "power_w": power / 1000 if power is not NA else NA,
            "power_limit_w": limit / 1000 if limit is not NA else NA,
            "sm_clock": nv.query("nvmlDeviceGetClockInfo", h, nv.const("NVML_CLOCK_SM")),
            "mem_clock": nv.query("nvmlDeviceGetClockInfo", h, nv.const("NVML_CLOCK_MEM")),
            "temp_c": nv.query("nvmlDeviceGetTemperature", h, nv.const("NVML_TEMPERATURE_GPU")),
            "throttle": throttle_names(nv, mask),
            "pcie_tx": self._pcie("NVML_PCIE_UTIL_TX_BYTES"),
            "pcie_rx": self._pcie("NVML_PCIE_UTIL_RX_BYTES"),
            "nvlink_tx": tx,
            "nvlink_rx": rx,
            "ecc_errors": nv.query(
                "nvmlDeviceGetTotalEccErrors",
                h,
                nv.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
                nv.const("NVML_VOLATILE_ECC"),
            ),
            "xid": list(xids or []),
        }
        return {k: value(v) for k, v in rec.items()}

    def _pcie(self, counter: str) -> Any:
        kb = self.nv.query("nvmlDeviceGetPcieThroughput", self.handle, self.nv.const(counter))
        return kb * 1024 if kb is not NA else NA  # NVML reports KB/s over a 20 ms window

    def _nvlink(self) -> tuple[Any, Any]:
        """Rates from the cumulative NVLink throughput counters (KiB); NA on the first sample."""
        ids = [
            self.nv.const("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
            self.nv.const("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
        ]
        if NA in ids:
            return NA, NA
        vals = self.nv.query("nvmlDeviceGetFieldValues", self.handle, ids)
        if vals is NA or len(vals) != 2 or any(getattr(v, "nvmlReturn", 0) for v in vals):
            return NA, NA
        now = time.monotonic()
        tx, rx = (int(v.value.ullVal) * 1024 for v in vals)
        prev, self._nvlink_prev = self._nvlink_prev, (now, tx, rx)
        if prev is None or now <= prev[0]:
            return NA, NA
        dt = now - prev[0]
        return (tx - prev[1]) / dt, (rx - prev[2]) / dt


class XidWatch:
    """Critical Xid events of all devices through one NVML event set (polled, never blocking)."""

    def __init__(self, nv: Nvml, readers: list[GpuReader]) -> None:
        self.nv, self.readers = nv, readers
        self.events = nv.query("nvmlEventSetCreate")
        kind = nv.const("nvmlEventTypeXidCriticalError")
        for r in readers:
            if self.events is not NA and kind is not NA:
                nv.query("nvmlDeviceRegisterEvents", r.handle, kind, self.events)

    def drain(self) -> dict[int, list[int]]:
        """{gpu index: [xid, ...]} seen since the last call."""
        out: dict[int, list[int]] = {}
        wait = getattr(self.nv.mod, "nvmlEventSetWait_v2", None) or getattr(
            self.nv.mod, "nvmlEventSetWait", None
        )
        if self.events is NA or wait is None:
            return out
        for _ in range(64):  # bounded: an Xid storm must not stall sampling
            try:
                data = wait(self.events, 0)
            except Exception:  # noqa: BLE001 - NVMLError_Timeout: nothing pending
                break
            idx = next((r.index for r in self.readers if r.handle == data.device), -1)
            out.setdefault(idx, []).append(int(data.eventData))
        return out

    def close(self) -> None:
        if self.events is not NA:
            self.nv.query("nvmlEventSetFree", self.events)
