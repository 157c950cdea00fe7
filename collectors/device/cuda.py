"""The CUDA side of the device seam: every `torch.cuda` call the collectors make.

Host-side only: allocator counters, device properties, timing events and an asynchronous copy plus
an event; nothing synchronizes the device. `ready()` is false until the job itself has initialized
CUDA: the agent must never create a CUDA context (hundreds of MB of device memory) in a job that
does not use the GPU. Collectors reach it only through `diag.collectors.device.backend`, which a
test replaces with a fake device (collectors/device/__init__.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from diag.agent.pending import Pending


class TorchCuda:
    """The real backend: thin calls into torch.cuda."""

    def __init__(self) -> None:
        self._available: bool | None = None  # asked once, after the job initialized CUDA
        self._cuda: Any = None  # the torch.cuda module, once imported
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._available = self._cuda = None

    def ready(self) -> bool:
        """The job uses CUDA (initialized). Asked lazily: at preload the model is not on the GPU yet.
        Runs at every step boundary: a bool read until the job initializes CUDA (an `import` and
        `is_available`, which asks the driver, cost ~8 us a step in a job, where a hook runs cold;
        `is_initialized()` two calls more, ~4 us): torch.cuda's own `_initialized` flag first, and
        once true the answer is kept (CUDA stays initialized; a forked child asks again: CUDA is
        not usable there, `is_initialized()` says False)."""
        if self._available:
            return True
        cuda = self._cuda or sys.modules.get("torch.cuda")  # kept once imported: a lookup fewer
        if cuda is None or getattr(cuda, "_initialized", None) is False:
            self._cuda = cuda
            return False
        if not cuda.is_initialized():
            return False
        if self._available is None:
            self._available = bool(cuda.is_available())
        return self._available

    def current_device(self) -> int:
        import torch

        return int(torch.cuda.current_device())

    def memory_stats(self, device: int) -> dict[str, Any]:
        """The caching allocator's counters (a host-side dict; no device synchronization)."""
        import torch

        return dict(torch.cuda.memory_stats(device))

    def total_memory(self, device: int) -> int:
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory)

    def device_name(self, device: int) -> str:
        """The device's marketing name ("NVIDIA H100 80GB HBM3"): what MFU's peak table matches."""
        import torch

        return str(torch.cuda.get_device_properties(device).name)

    def reset_peak(self, device: int) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(device)

    def memory_allocated(self) -> int:
        """Bytes the caching allocator holds for tensors now (a host-side counter, no sync)."""
        import torch

        return int(torch.cuda.memory_allocated())

    def timer(self) -> CudaTimer:
        import torch

        return CudaTimer(torch.cuda.Event)

    def scalar_later(self, tensor: Any) -> Pending:
        """A one-element CUDA tensor's value, copied asynchronously; read once its event completes."""
        return _CopiedScalar(tensor)


class _CopiedScalar(Pending):
    """Non-blocking device-to-host copy into pinned memory, ordered on the current stream."""

    __slots__ = ("_event", "_host")

    def __init__(self, tensor: Any) -> None:
        import torch

        self._host = torch.empty(1, dtype=torch.float32, pin_memory=True)
        self._host.copy_(tensor.detach().reshape(-1)[:1], non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def ready(self) -> bool:
        return bool(self._event.query())

    def value(self) -> float:
        return float(self._host[0])


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
    """Records a timing event on the stream at start and stop (the current one, or the one passed in:
    comms passes the collective's); the host never waits, as Megatron's StragglerDetector does."""

    def __init__(self, event_cls: Callable[..., Any]) -> None:
        self.event_cls = event_cls

    def _record(self, stream: Any) -> Any:
        event = self.event_cls(enable_timing=True)
        event.record(stream)
        return event

    def start(self, stream: Any = None) -> Any:
        return self._record(stream)

    def stop(self, token: Any, stream: Any = None) -> EventSpan:
        return EventSpan(token, self._record(stream))
