"""The one seam between collectors and `torch.cuda`, so CPU tests can substitute a fake device.

Collectors call `cuda.backend.<method>` at hook time (never a cached bound method), so a test can
swap `backend` with `use(fake)` and restore it afterwards. Every method here is host-side: allocator
counters, device properties, an asynchronous copy plus an event; nothing synchronizes the device.
`ready()` is false until the job itself has initialized CUDA: the agent must never create a CUDA
context (hundreds of MB of device memory) in a job that does not use the GPU.
"""

from __future__ import annotations

import sys
from typing import Any

from diag.agent.pending import Pending


class TorchCuda:
    """The real backend: thin calls into torch.cuda."""

    def ready(self) -> bool:
        from diag.collectors.timing import job_device

        return job_device() == "cuda"

    def current_device(self) -> int:
        import torch

        return torch.cuda.current_device()

    def memory_stats(self, device: int) -> dict[str, Any]:
        """The caching allocator's counters (a host-side dict; no device synchronization)."""
        import torch

        return torch.cuda.memory_stats(device)

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


backend: Any = TorchCuda()


def use(new: Any) -> Any:
    """Install another backend (tests: a fake device); returns the previous one to restore."""
    global backend
    old, backend = backend, new
    return old


def _scalar_tensor(value: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
        return value
    return None


def host_float(value: Any) -> float | None:
    """A number that is already on the host (a float, a CPU scalar tensor); None for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    tensor = _scalar_tensor(value)
    return float(tensor.detach()) if tensor is not None and tensor.device.type == "cpu" else None


def host_scalar(value: Any) -> float | Pending | None:
    """Like `host_float`, but a CUDA scalar becomes a `Pending` the writer thread resolves later."""
    tensor = _scalar_tensor(value)
    if tensor is not None and tensor.device.type == "cuda":
        return backend.scalar_later(tensor)
    return host_float(value)
