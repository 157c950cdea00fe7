"""The CPU side of the device seam: wall-clock timing and no device memory.

A `Timer`'s `start()` returns a token and `stop(token)` a duration in ns: an int here, or on CUDA a
`Pending` the writer thread resolves once the end event has completed (collectors/device/cuda.py).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from diag.agent.pending import Pending


class Timer(Protocol):
    def start(self, stream: Any = None) -> Any: ...
    def stop(self, token: Any, stream: Any = None) -> int | Pending: ...


class CpuTimer:
    """Wall clock around the work: the truth on CPU and gloo, where calls are synchronous."""

    def start(self, stream: Any = None) -> int:
        return time.perf_counter_ns()

    def stop(self, token: int, stream: Any = None) -> int:
        return time.perf_counter_ns() - token


def no_memory() -> None:
    """Allocated device bytes on CPU: none to report."""
    return None
