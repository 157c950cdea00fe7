"""The NVML hardware boundary (nvitop style): every query returns a value or `NA`, never raises.

`Nvml` wraps a pynvml-like module (the real `pynvml` from nvidia-ml-py, or a fake in the tests).
A function the driver or the binding lacks is logged once and answers `NA` from then on, so one
old driver field never costs a log line per sample or stops the other fields.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

log = logging.getLogger("diag.nvml")


class _NA:
    """Not available: falsy, prints as "N/A", written to JSON as null by `value()`."""

    _instance: _NA | None = None

    def __new__(cls) -> _NA:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "N/A"


NA: Any = _NA()


def value(x: Any) -> Any:
    """NA -> None (JSON null); anything else unchanged."""
    return None if x is NA else x


def load_module() -> ModuleType | None:
    """The pynvml module of nvidia-ml-py, or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    module: ModuleType = pynvml  # untyped binding (not followed by mypy)
    return module


class Nvml:
    """A started NVML session. `error` holds why it could not start ("NVML not found", ...)."""

    def __init__(self, module: ModuleType | None) -> None:
        self.mod = module
        self.error: str | None = None
        self.missing: set[str] = set()
        self.started = False

    def start(self) -> bool:
        if self.mod is None:
            self.error = "nvidia-ml-py is not installed"
            return False
        try:
            self.mod.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - any init failure means "no GPU to watch"
            self.error = describe_error(self.mod, exc)
            return False
        self.started = True
        return True

    def stop(self) -> None:
        if self.started:
            self.query("nvmlShutdown")
            self.started = False

    def query(self, name: str, *args: Any, default: Any = NA) -> Any:
        """Call `mod.<name>(*args)`; NA (logged once per function) if missing or unsupported."""
        fn = getattr(self.mod, name, None)
        if fn is None:
            self._once(name, "not in this NVML binding")
            return default
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported, NoPermission, ...
            self._once(name, describe_error(self.mod, exc))
            return default

    def const(self, *names: str) -> Any:
        """The first of `names` the binding defines (constants were renamed across versions)."""
        for n in names:
            if hasattr(self.mod, n):
                return getattr(self.mod, n)
        return NA

    def _once(self, name: str, why: str) -> None:
        if name not in self.missing:
            self.missing.add(name)
            log.info("NVML %s unavailable: %s", name, why)


def describe_error(mod: ModuleType | None, exc: BaseException) -> str:
    """A short reason: "NVML not found" for the missing-library case the UI shows as is."""
    lib_missing = getattr(mod, "NVMLError_LibraryNotFound", None)
    if lib_missing is not None and isinstance(exc, lib_missing):
        return "NVML not found"
    text = str(exc) or type(exc).__name__
    return text
