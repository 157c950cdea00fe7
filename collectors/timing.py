"""Timing and memory seams for hooks: wall clock on CPU, CUDA events on GPU, never a synchronize.

`Timer.start()` returns a token, `Timer.stop(token)` a duration in ns: an int on CPU, or an
`EventSpan` (a `Pending`) on CUDA, which the writer thread resolves once the end event has completed
(`query()`), as Megatron's StragglerDetector does. Events are recorded on the current stream, or on the
stream passed in (the comms collector passes the collective's). Tests inject a fake event class.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

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


class EventSpan(Pending):
    """GPU time between two recorded events, readable once the end event has completed."""

    __slots__ = ("begin", "end")

    def __init__(self, begin: Any, end: Any) -> None:
        self.begin = begin
        self.end = end

    def ready(self) -> bool:
        return bool(self.end.query())

    def value(self) -> int:
        return int(self.begin.elapsed_time(self.end) * 1e6)  # elapsed_time is in ms


class CudaTimer:
    """Records a timing event on the stream at start and stop; the host never waits."""

    def __init__(self, event_cls: Callable[..., Any] | None = None) -> None:
        self.event_cls = event_cls or torch.cuda.Event

    def _record(self, stream: Any) -> Any:
        event = self.event_cls(enable_timing=True)
        event.record(stream)
        return event

    def start(self, stream: Any = None) -> Any:
        return self._record(stream)

    def stop(self, token: Any, stream: Any = None) -> EventSpan:
        return EventSpan(token, self._record(stream))


def job_device() -> str:
    """'cuda' once the job uses CUDA (initialized), else 'cpu'. Asked lazily: at preload time the
    model is not on the GPU yet."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


def make_timer(device: str, event_cls: Callable[..., Any] | None = None) -> Timer:
    return CudaTimer(event_cls) if device == "cuda" else CpuTimer()


def memory_probe(device: str) -> Callable[[], int | None]:
    """Bytes allocated now by the caching allocator (host-side counter, no sync); None on CPU."""
    if device == "cuda":
        return torch.cuda.memory_allocated
    return _no_memory


def _no_memory() -> None:
    return None
