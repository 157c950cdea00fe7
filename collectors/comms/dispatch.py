"""Collectives that C++ issues (DistributedDataParallel's Reducer above all), seen at the dispatcher.

DDP's reducer calls the ProcessGroup's C++ methods directly, past the Python class methods `comms`
wraps, so plain DDP's gradient all-reduces went unseen (0 collectives on a torchrun DDP job). Every
ProcessGroup method, whoever calls it, dispatches one `c10d::` op (`c10d::allreduce_`, ...). At the
Autograd key those ops have only autograd's backend fallback, which has nothing to do for them (their
tensors are communication buffers), so a Python kernel registered there sees every call. It records
only the calls the Python wrappers did not (they mark their thread while they run), with the same
record and completion timing, then runs the op below autograd: the kernel that runs is the one that
would have run. Undo destroys the registration, which restores the dispatcher table as it was.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from diag.collectors.comms.timing import CPU_CALL

from diag.agent.undo import Undo

# c10d op -> (the ProcessGroup method whose Spec reads its arguments: same positions; the group's index)
OPS: dict[str, tuple[str, int]] = {
    "allreduce_": ("allreduce", 1),
    "allreduce_coalesced_": ("allreduce_coalesced", 1),
    "broadcast_": ("broadcast", 1),
    "reduce_": ("reduce", 1),
    "allgather_": ("allgather", 2),
    "_allgather_base_": ("_allgather_base", 2),
    "allgather_coalesced_": ("allgather_coalesced", 2),
    "allgather_into_tensor_coalesced_": ("allgather_into_tensor_coalesced", 2),
    "reduce_scatter_": ("reduce_scatter", 2),
    "_reduce_scatter_base_": ("_reduce_scatter_base", 2),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", 2),
    "alltoall_": ("alltoall", 2),
    "alltoall_base_": ("alltoall_base", 2),
    "gather_": ("gather", 2),
    "scatter_": ("scatter", 2),
    "send": ("send", 1),
    "recv_": ("recv", 1),
    "recv_any_source_": ("recv_anysource", 1),
    "barrier": ("barrier", 1),
}

# A Python wrapper of `comms` is running on this thread: its call is recorded there.
marked = threading.local()

Before = Callable[[int, tuple[Any, ...], dict[str, Any]], Any]
After = Callable[[int, Any, Any, Any, tuple[Any, ...], dict[str, Any]], None]
Recorder = Callable[[str], "tuple[Before, After] | None"]
Guard = Callable[[Callable[..., Any], str], Callable[..., Any]]


def register(
    undo: Undo,
    recorder: Recorder,
    guard: Guard,
    run: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any],
    may_be_gpu: Callable[[], bool],
) -> None:
    """A kernel at the Autograd key of every c10d op this torch has. `recorder(method)` gives the
    (before, after) of the ProcessGroup method whose arguments the op takes (None: not recorded),
    `guard(fn, where)` the agent's guard, `run(fn, args, kwargs)` the call as the wrappers make it
    (below diag's FLOP counter on sampled steps); `before` runs only where `may_be_gpu()`, as in
    the wrappers (collectors/comms/__init__.py)."""
    import torch
    from torch._C._distributed_c10d import Work
    from torch.distributed import ProcessGroup

    lib = torch.library.Library("c10d", "IMPL")
    undo.call(lib._destroy, "comms: c10d dispatcher kernels")
    below = torch._C._AutoDispatchBelowAutograd

    for name, (method, pg_index) in OPS.items():
        packet = getattr(torch.ops.c10d, name, None)
        parts = recorder(method)
        if packet is None or parts is None:
            continue
        before, after = parts

        def finish(
            t0: int,
            state: Any,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            out: Any,
            after: After = after,
            pg_index: int = pg_index,
        ) -> None:
            work = out[1] if type(out) is tuple and len(out) == 2 else out
            after(
                t0,
                state,
                ProcessGroup.unbox(args[pg_index]),
                Work.unbox(work) if isinstance(work, torch.ScriptObject) else None,
                args,
                kwargs,
            )

        kernel = _kernel(packet.default, guard(before, name), guard(finish, name), below, run, may_be_gpu)
        lib.impl(name, kernel, "Autograd")


def _kernel(
    op: Any,
    before: Callable[..., Any],
    finish: Callable[..., Any],
    below: Any,
    run: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any],
    may_be_gpu: Callable[[], bool],
) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        if getattr(marked, "on", False):  # a Python wrapper of `comms` records this call
            with below():
                return op(*args, **kwargs)
        t0 = time.perf_counter_ns()
        state = before(t0, args, kwargs) if may_be_gpu() else CPU_CALL
        with below():
            out = run(op, args, kwargs)
        if state is not None:
            finish(t0, state, args, kwargs, out)
        return out

    return kernel
