"""The one seam between the collectors and the device: timing, allocator memory and scalars.

Collectors ask this module, never `torch.cuda`: `job_device()`, `make_timer(device)`,
`memory_probe(device)`, `host_float` / `host_scalar`, and `backend.<method>` for allocator counters.
Each call reads `backend` at call time (never a cached bound method), so a test swaps the whole
device with `use(fake)` and restores it afterwards: a fake whose `ready()` is true drives the CUDA
path on CPU. The real backend is `cuda.TorchCuda`; `cpu` holds the fallback beside it (wall clock, no
device memory). Nothing here synchronizes the device or creates a CUDA context.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from diag.collectors.device.cpu import CpuTimer, Timer, no_memory
from diag.collectors.device.cuda import CudaTimer, EventSpan, TorchCuda

from diag.agent.pending import Pending

__all__ = [
    "CpuTimer",
    "CudaTimer",
    "EventSpan",
    "Timer",
    "TorchCuda",
    "backend",
    "host_float",
    "host_scalar",
    "job_device",
    "make_timer",
    "memory_probe",
    "use",
]

backend: Any = TorchCuda()


def use(new: Any) -> Any:
    """Install another backend (tests: a fake device); returns the previous one to restore."""
    global backend
    old, backend = backend, new
    return old


def job_device() -> str:
    """'cuda' once the job uses CUDA (initialized), else 'cpu'."""
    return "cuda" if backend.ready() else "cpu"


def make_timer(device: str) -> Timer:
    """CUDA events on the stream for 'cuda' (the backend's), else the wall clock."""
    timer: Timer = backend.timer() if device == "cuda" else CpuTimer()
    return timer


def _allocated() -> int | None:
    return int(backend.memory_allocated())


def memory_probe(device: str) -> Callable[[], int | None]:
    """Bytes allocated now by the caching allocator (host-side counter, no sync); None on CPU."""
    return _allocated if device == "cuda" else no_memory


def _scalar_tensor(value: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
        return value
    return None


def host_float(value: Any) -> float | None:
    """A number that is already on the host (a float, a CPU scalar tensor); None for anything else.
    Runs every step on the grad norm: a CPU tensor is read with `is_cpu` and `item()` alone (one
    element, else item() raises), ~15 us less where the hook runs cold than an isinstance, a
    `numel()` and then the two; never `float(t.detach())` or `t.device.type` (~4 us more warm)."""
    kind = type(value)
    if kind is float or kind is int:
        return float(value)
    if value is None or kind is bool:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value.item()) if value.is_cpu is True else None  # on a GPU: never read here
    except (AttributeError, RuntimeError, TypeError, ValueError):  # not a tensor, not one element
        return None


def host_scalar(value: Any) -> float | Pending | None:
    """Like `host_float`, but a CUDA scalar becomes a `Pending` the writer thread resolves later."""
    tensor = _scalar_tensor(value)
    if tensor is not None and tensor.device.type == "cuda":
        return backend.scalar_later(tensor)  # type: ignore[no-any-return]
    return host_float(value)
