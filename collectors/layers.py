"""Per-module forward and backward time, FLOPs and memory delta on sampled steps.

A sampled step is one where `agent.sampled` is set (the steps collector, every `layers_every`
steps). Before any step boundary has been seen (attach into a loop the steps collector does not
know), every `layers_every`-th outermost forward (micro-batch) is sampled instead, counting from the
first one seen. Sampled steps are always tracked steps of the module tracker (collectors/modules.py),
whose hooks drive this recorder; on other steps its global hooks are off (except every
`attribute_every`-th step, where the only cost is the tracker's plus one check per outermost forward).

On a sampled micro-batch a `FlopMode` (a TorchDispatchMode, thread-local) is pushed on the training
thread from the outermost forward's pre-hook and popped at the step boundary (or at the next
non-sampled outermost forward). It executes every aten op unchanged, so numerics are untouched, and
adds each op's FLOPs (collectors/flops.py) to one running total. A module's record covers the time
between its enter and exit as the tracker sees them, so its FLOPs are the total's growth over that
interval: INCLUSIVE (a parent includes its children). A module can have several records per step
and phase (micro-batches, re-entered backward, shared modules): readers sum them.

Emits `(LAYER, step, module, phase, ts, dur, flops, mem_delta)`, phase "fwd"/"bwd"; `dur` is a
CUDA-event `Pending` on GPU (collectors/timing.py) and `mem_delta` the allocator's allocated-bytes
change over the interval (None on CPU).

Limits: a sampled step runs every op through Python (x1.6 here, FlopCounterMode x2.7), and inside
torch.compile'd code the mode causes graph breaks on sampled steps. `stop()` from another thread
while the mode is pushed leaves it transparent and one self-removing hook that pops it at the
training thread's next module call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from collectors import modules
from collectors.flops import FORMULAS, count
from collectors.timing import job_device, make_timer, memory_probe
from diag import schema
from diag.agent.undo import Undo

_graph_task_id = torch._C._current_graph_task_id


class FlopMode(TorchDispatchMode):
    """Runs each op as is and adds its FLOPs to `total`; an error in counting is counted, not raised."""

    supports_higher_order_operators = True  # pass them through untouched

    def __init__(self, agent: Any) -> None:
        super().__init__()
        self.agent = agent
        self.total = 0
        self.on = True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.on:
            packet = getattr(func, "_overloadpacket", None)
            if packet in FORMULAS:
                try:
                    self.total += count(packet, args, kwargs, out)
                except Exception as exc:  # noqa: BLE001 - a formula bug must not break the job
                    self.agent.record_error("layers", f"flops {packet}", exc)
        return out


class LayerRecorder:
    """The module tracker's listener: opens and closes intervals, pushes and pops the FlopMode."""

    def __init__(self, agent: Any, event_cls: Any = None, device: str | None = None,
                 memory: Callable[[], int | None] | None = None) -> None:
        self.agent = agent
        # seams for tests of the CUDA path on CPU: a fake event class, device, allocated-bytes probe
        self.event_cls, self.device, self.memory_fn = event_cls, device, memory
        self.active = False
        self.steps_seen = False
        self.micro = 0
        self.mode: FlopMode | None = None
        self.mode_thread = 0
        self.timer: Any = None
        self.memory: Any = None
        self.open: dict[tuple[str, str], tuple[int, Any, int, int | None]] = {}

    # ---- tracker callbacks (guarded by install) ----------------------------------------------
    def fwd(self, name: str, outermost: bool) -> None:
        if outermost and _graph_task_id() == -1:
            self._decide()
        if self.active:
            self._open(name, "fwd")

    def fwd_end(self, name: str) -> None:
        self._close(name, "fwd")

    def bwd(self, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        common = 0
        for a, b in zip(old, new):
            if a != b:
                break
            common += 1
        for name in reversed(old[common:]):
            self._close(name, "bwd")
        for name in new[common:]:
            self._open(name, "bwd")

    def on_step(self, step: int) -> None:
        """Step boundary: the sampled micro-batches are over; the next outermost forward decides."""
        self.steps_seen = True
        self.active = False
        self.open.clear()
        self._pop()

    # ---- sampling and the dispatch mode --------------------------------------------------------
    def _decide(self) -> None:
        every = self.agent.layers_every
        if self.steps_seen:
            want = bool(self.agent.sampled)
        else:
            want = every > 0 and self.micro % every == 0
            self.micro += 1
        self.open.clear()
        if want:
            self._push()
        else:
            self._pop()
        self.active = want and self.mode is not None

    def _push(self) -> None:
        if self.mode is not None:
            return
        device = self.device or job_device()
        self.timer = make_timer(device, self.event_cls)
        self.memory = self.memory_fn or memory_probe(device)
        mode = FlopMode(self.agent)
        mode.__enter__()
        self.mode, self.mode_thread = mode, threading.get_ident()

    def _pop(self) -> bool:
        """Pop the mode if this thread can (its own, on top, outside backward); True when gone."""
        mode = self.mode
        if mode is None:
            return True
        if (self.mode_thread != threading.get_ident() or _graph_task_id() != -1
                or _get_current_dispatch_mode() is not mode):
            return False
        self.mode = None
        mode.__exit__(None, None, None)
        return True

    # ---- intervals ---------------------------------------------------------------------------------
    def _open(self, name: str, phase: str) -> None:
        key = (name, phase)
        if key not in self.open and self.mode is not None:
            self.open[key] = (self.agent.now(), self.timer.start(), self.mode.total, self.memory())

    def _close(self, name: str, phase: str) -> None:
        rec = self.open.pop((name, phase), None)
        if rec is None or self.mode is None:
            return
        ts, token, flops0, mem0 = rec
        dur = self.timer.stop(token)
        mem1 = self.memory()
        delta = None if mem0 is None or mem1 is None else mem1 - mem0
        agent = self.agent
        agent.emit((schema.LAYER, agent.step, name, phase, ts, dur, self.mode.total - flops0, delta))

    # ---- stop ------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Undo action: stop listening; pop the mode, or, if it lives on another thread (stop() from
        an attach thread), make it transparent and pop it from that thread's next module call."""
        self.active = False
        self.open.clear()
        mode = self.mode
        if mode is None or self._pop():
            return
        mode.on = False
        handle: Any = None

        def pop_later(_mod: Any, _args: Any) -> None:
            try:
                done = self._pop()
            except Exception:  # noqa: BLE001 - the agent is gone; never raise into the job
                done = True
            if done:
                handle.remove()

        handle = register_module_forward_pre_hook(pop_later)


def _warm_up() -> None:
    """The first TorchDispatchMode use imports torch._dynamo (1-3 s here): pay it at install, on the
    installing thread; the mode stack is thread-local, so the training thread never sees this one."""
    mode = FlopMode(None)
    mode.on = False
    with mode:
        torch.zeros(1).add_(1)


def install(agent: Any, undo: Undo, **seams: Any) -> None:
    """Listen to the module tracker (installing it if comms has not) and to step boundaries.
    `seams` (tests only): event_cls, device, memory, as LayerRecorder takes them."""
    _warm_up()
    tracker = modules.ensure_installed(agent, undo)
    recorder = LayerRecorder(agent, **seams)
    guard = agent.guard
    recorder.fwd = guard("layers", recorder.fwd, "fwd")  # type: ignore[method-assign]
    recorder.fwd_end = guard("layers", recorder.fwd_end, "fwd-end")  # type: ignore[method-assign]
    recorder.bwd = guard("layers", recorder.bwd, "bwd")  # type: ignore[method-assign]
    listener = guard("layers", recorder.on_step, "step")
    tracker.listener = recorder
    agent.step_listeners.append(listener)
    agent.layer_recorder = recorder
    undo.call(recorder.shutdown, "layers.mode")
    undo.call(lambda: setattr(tracker, "listener", None), "layers.listener")
