"""Per-module forward and backward time, FLOPs and memory delta on sampled steps.

A sampled step is one where `agent.sampled` is set (the steps collector, every `layers_every`
steps, and the first steady step, the third, where the agent started with the job). Before any
step boundary has been seen, the step under way is sampled whole when the agent started with the
job, and not at all after an attach (it is partial); a loop with no boundary within
64 micro-batches (one the steps collector does not know) has every `layers_every`-th outermost
forward (micro-batch) sampled from then on. Sampled steps are always tracked steps of the module
tracker (collectors/modules.py), whose hooks drive this recorder; on other steps its global hooks
are off (except every `attribute_every`-th step, where the only cost is the tracker's plus one check
per outermost forward).

On a sampled micro-batch that counts FLOPs a `FlopMode` (a TorchDispatchMode, thread-local) is
pushed on the training thread from the outermost forward's pre-hook and popped at the step boundary
(or at the next outermost forward that does not count). It executes every aten op unchanged, so
numerics are untouched, and adds each op's FLOPs (collectors/flops.py) to one running total. A
module's record covers the time between its enter and exit as the tracker sees them, so its FLOPs
are the total's growth over that interval: INCLUSIVE (a parent includes its children). A module can
have several records per step and phase (micro-batches, re-entered backward, shared modules):
readers sum them.

Counting is most of a sampled step's cost (every op through Python), and a module's FLOPs follow
from the shapes it sees. So FLOPs are counted on the first sampled micro-batch of each input
signature (the outermost module's name and the shapes and dtypes of its tensor arguments) and
again every `flops_every`-th sample of it (`AgentOptions.flops_every`; 1 = every sample), with
the later micro-batches of a step that counts (a pipeline stage runs its forwards before its
backwards: all of them count); the samples in between time every module and reuse the counted
FLOPs of the same (module, phase, occurrence). A forward run with grad off (an evaluation inside a
training loop) is never sampled: no backward follows it, and its counts reused for training steps
had no backward FLOPs. Exact for models whose shapes follow their inputs; where they do not (MoE
routing: a module named `experts` was counted), every sample counts, since each expert's rows
change with the router's choice every step (reused, they were up to 6% off at 4 experts, top-2);
one never counted under this signature is null.

Emits `(LAYER, step, module, phase, ts, dur, flops, mem_delta)`, phase "fwd"/"bwd"; `dur` is a
CUDA-event `Pending` on GPU (collectors/device/) and `mem_delta` the allocator's allocated-bytes
change over the interval (None on CPU).

Limits: a counting step runs every op through Python (x1.6 here, FlopCounterMode x2.7), and inside
torch.compile'd code the mode causes graph breaks on sampled steps. `stop()` from another thread
while the mode is pushed leaves it transparent and one self-removing hook that pops it at the
training thread's next module call; `stop()` waits up to POP_WAIT_S for that call, so a detach
returns with the job as before.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from diag.collectors import modules
from diag.collectors.device import CpuTimer, job_device, make_timer, memory_probe
from diag.collectors.flops import FORMULAS, count
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from diag import schema
from diag.agent.api import AgentAPI, StepListener
from diag.agent.undo import Undo

_graph_task_id = torch._C._current_graph_task_id
# a module named so is an MoE expert (megatron-core `mlp.experts.local_experts.0`, DeepSpeed
# `deepspeed_moe.experts.deepspeed_experts.0`): its shapes follow the router's choice each step
ROUTED = "experts"
MAX_SIGNATURES = 64  # distinct input signatures remembered before the FLOP cache starts over
FIRST_STEP_MICRO = 64  # micro-batches before a first step boundary that make a loop boundary-less


class FlopMode(TorchDispatchMode):
    """Runs each op as is and adds its FLOPs to `total`; an error in counting is counted, not raised."""

    supports_higher_order_operators = True  # pass them through untouched

    def __init__(self, agent: AgentAPI | None) -> None:
        super().__init__()
        self.agent = agent
        self.total = 0
        self.on = True

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.on:
            packet = getattr(func, "_overloadpacket", None)
            if packet in FORMULAS:
                try:
                    self.total += count(packet, args, kwargs, out)
                except Exception as exc:  # noqa: BLE001 - a formula bug must not break the job
                    if self.agent is not None:  # None: the install's warm-up, no agent to tell
                        self.agent.record_error("layers", f"flops {packet}", exc)
        return out


POP_WAIT_S = 1.0  # how long a stop() from another thread waits for the training thread's next module
# call to pop the FlopMode (a running step makes one within milliseconds)


class LayerRecorder:
    """The module tracker's listener: opens and closes intervals, pushes and pops the FlopMode."""

    def __init__(self, agent: AgentAPI) -> None:
        self.agent = agent
        self.active = False
        self.steps_seen = False
        self.micro = 0
        self.mode: FlopMode | None = None
        self.mode_thread = 0
        self.timer: Any = None
        self.memory: Any = None
        self.open: dict[tuple[str, str], tuple[int, Any, int, int | None]] = {}
        self.flops_every = agent.options.flops_every
        self.counting = False  # this sample runs the FlopMode (else: reuses counted FLOPs)
        self.count_step: int | None = None  # the step whose micro-batches the FlopMode counts
        self.joined = agent.options.joined
        self.sig: tuple[Any, ...] = ()
        self.since: dict[tuple[Any, ...], int] = {}  # signature -> samples since it was counted
        self.routed = False  # the model holds experts (MoE): every sample counts
        self.flops: dict[tuple[Any, ...], int] = {}  # (signature, module, phase, occurrence) -> FLOPs
        self.occurrence: dict[tuple[str, str], int] = {}
        self.listener: StepListener | None = None  # its step listener (install), while `listening`
        self.listening = False

    # ---- tracker callbacks (guarded by install) ----------------------------------------------
    def fwd(self, name: str, outermost: bool, args: tuple[Any, ...] = ()) -> None:
        if outermost and _graph_task_id() == -1:
            self._decide(name, args)
            if not self.listening and (self.active or self.mode is not None):
                self._listen(True)  # a sample began: its step's boundary ends it
        if self.active:
            self._open(name, "fwd")

    def fwd_end(self, name: str, raised: bool = False) -> None:
        if raised:  # a forward that raised (its caller may retry it): no record
            self.open.pop((name, "fwd"), None)
        else:
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
        """Step boundary: the sampled micro-batches are over; the next outermost forward decides.
        With nothing left to end, the listener leaves the step listeners until a sample begins
        (`fwd`): unsampled steps call it no more (a call at each boundary, ~2 us where it runs cold)."""
        self.steps_seen = True
        if self.active or self.open or self.mode is not None:  # else (most steps) nothing to end
            self.active = False
            self.open.clear()
            self._pop()
        if self.mode is None and self.listening:  # a mode on another thread is popped later
            self._listen(False)

    def _listen(self, on: bool) -> None:
        """Join or leave the agent's step listeners (a new list: `begin_step` may be iterating)."""
        agent, mine = self.agent, self.listener
        others = [f for f in agent.step_listeners if f is not mine]
        agent.step_listeners = [*others, mine] if on and mine is not None else others
        self.listening = on

    # ---- sampling and the dispatch mode --------------------------------------------------------
    def _decide(self, outermost: str, args: tuple[Any, ...]) -> None:
        every = self.agent.layers_every
        if not torch.is_grad_enabled():
            want = False  # an eval forward inside a training step (nanoGPT's at iteration 0): no
            # backward follows, so its times and FLOPs are not the step's training layers
        elif self.steps_seen:
            want = bool(self.agent.sampled)
        else:
            want = every > 0 and self._first_step_sample()
        if want and self.counting and self.mode is not None and self.count_step == self.agent.step:
            # a later micro-batch of a step that counts: it counts too. A pipeline stage runs
            # F F B B: deciding again here popped the mode, and neither backward was counted
            self.sig = (outermost, *signature(args))
            self.occurrence.clear()
            self.active = True
            return
        self.open.clear()
        if not want:
            self._pop()
            self.active = False
            return
        device = job_device()  # the device seam (tests of the CUDA path on CPU swap its backend)
        self.timer = make_timer(device)
        self.memory = memory_probe(device)
        self.sig = (outermost, *signature(args))  # a sample that began inside the model (attach,
        # a pipeline stage's own root) must not reuse FLOPs counted from another module's start
        self.occurrence.clear()
        self.counting = self._count_now(self.sig) or not self._pop()  # a mode it cannot pop still counts
        if self.counting:
            self._push()
            self.count_step = self.agent.step
        self.active = not self.counting or self.mode is not None

    def _first_step_sample(self) -> bool:
        """Before any step boundary: the step under way whole, every micro-batch of it, when the
        agent started with the job (sampling its first micro-batch alone gave a step of GAS 2 half
        its FLOPs, reused up to the first sampled step); none of it after an attach, which lands
        mid-step. No boundary within FIRST_STEP_MICRO micro-batches: a loop the steps collector does
        not know, sampled every `layers_every`-th micro-batch from then on."""
        every, micro = self.agent.layers_every, self.micro
        self.micro += 1
        if micro < max(every, FIRST_STEP_MICRO):
            return not self.joined
        return micro % every == 0

    def _count_now(self, sig: tuple[Any, ...]) -> bool:
        """Count FLOPs on this sample? The first of a signature, then every `flops_every`-th; every
        one where the model routes tokens to experts (`routed`)."""
        if self.routed:
            return True
        since = self.since.get(sig)
        if since is None and len(self.since) >= MAX_SIGNATURES:
            self.since.clear()
            self.flops.clear()
        if since is None or since + 1 >= self.flops_every:
            self.since[sig] = 0
            return True
        self.since[sig] = since + 1
        return False

    def _push(self) -> None:
        if self.mode is not None:
            return
        mode = FlopMode(self.agent)
        mode.__enter__()
        self.mode, self.mode_thread = mode, threading.get_ident()

    def _pop(self) -> bool:
        """Pop the mode if this thread can (its own, on top, outside backward); True when gone."""
        mode = self.mode
        if mode is None:
            return True
        if (
            self.mode_thread != threading.get_ident()
            or _graph_task_id() != -1
            or _get_current_dispatch_mode() is not mode
        ):
            return False
        self.mode = None
        mode.__exit__(None, None, None)
        return True

    # ---- intervals ---------------------------------------------------------------------------------
    def _open(self, name: str, phase: str) -> None:
        key = (name, phase)
        if key not in self.open and self.active:
            mode = self.mode
            ts = self.agent.now()  # on CPU also the timer's start: one clock reading, so a child
            token = ts if type(self.timer) is CpuTimer else self.timer.start()  # ends within its parent
            self.open[key] = (ts, token, mode.total if mode else 0, self.memory())

    def _close(self, name: str, phase: str) -> None:
        key = (name, phase)
        rec = self.open.pop(key, None)
        if rec is None or not self.active:
            return
        ts, token, flops0, mem0 = rec
        dur = self.timer.stop(token)
        mem1 = self.memory()
        delta = None if mem0 is None or mem1 is None else mem1 - mem0
        k = self.occurrence.get(key, 0)
        self.occurrence[key] = k + 1
        at = (self.sig, name, phase, k)
        mode = self.mode
        flops: int | None
        if self.counting and mode is not None:
            flops = self.flops[at] = mode.total - flops0
            if not self.routed and ROUTED in name:
                self.routed = True  # experts' shapes follow the router, not the input: count always
        else:
            flops = self.flops.get(at)
        agent = self.agent
        agent.emit((schema.LAYER, agent.step, name, phase, ts, dur, flops, delta))

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
        popped = threading.Event()

        def pop_later(_mod: Any, _args: Any) -> None:
            try:
                done = self._pop()
            except Exception:  # noqa: BLE001 - the agent is gone; never raise into the job
                done = True
            if done:
                handle.remove()
                popped.set()

        handle = register_module_forward_pre_hook(pop_later)
        if self.mode_thread != threading.get_ident():
            # a detach returns once the job is as before: a running job's next module call is
            # milliseconds away (a job blocked elsewhere keeps the hook until its next call)
            popped.wait(POP_WAIT_S)


def _warm_up() -> None:
    """The first TorchDispatchMode use imports torch._dynamo (1-3 s here): pay it at install, on the
    installing thread; the mode stack is thread-local, so the training thread never sees this one."""
    mode = FlopMode(None)
    mode.on = False
    with mode:
        torch.zeros(1).add_(1)


def install(agent: AgentAPI, undo: Undo) -> None:
    """Listen to the module tracker (installing it if comms has not) and to step boundaries."""
    _warm_up()
    tracker = modules.ensure_installed(agent, undo)
    recorder = LayerRecorder(agent)
    guard = agent.guard
    recorder.fwd = guard("layers", recorder.fwd, "fwd")  # type: ignore[method-assign]
    recorder.fwd_end = guard("layers", recorder.fwd_end, "fwd-end")  # type: ignore[method-assign]
    recorder.bwd = guard("layers", recorder.bwd, "bwd")  # type: ignore[method-assign]
    listener = StepListener("layers", "step", recorder.on_step)
    tracker.listener = recorder
    recorder.listener, recorder.listening = listener, True
    agent.step_listeners.append(listener)
    agent.state.put(recorder)
    agent.set_meta(schema.META_FLOPS_EVERY, recorder.flops_every)
    undo.call(recorder.shutdown, "layers.mode")
    undo.call(lambda: setattr(tracker, "listener", None), "layers.listener")


def signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Shapes and dtypes of the tensors among a forward's arguments (and inside a list or tuple
    argument, a dict's values: a batch), the key under which counted FLOPs are reused."""
    out: list[Any] = []
    for a in args:
        items = a.values() if isinstance(a, dict) else a if isinstance(a, (list, tuple)) else (a,)
        for x in items:
            if isinstance(x, torch.Tensor):
                out.append((tuple(x.shape), x.dtype))
    return tuple(out)
