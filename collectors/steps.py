"""Step boundaries: one `step` record per optimizer step, and `agent.begin_step` for the others.

Sources, in order of trust:
- DeepSpeed: a class-level wrapper of `DeepSpeedEngine._take_model_step`, the boundary itself (one
  wrapper shared with the overflow collector: collectors/boundary.py)
  (`engine.step()` calls it only at gradient-accumulation boundaries, and `PipelineEngine.train_batch`
  calls it directly, bypassing `step()`). A step carries the number the job gives it: `engine.global_steps`
  once it is taken (`global_steps + 1` while it runs), which is what DeepSpeed logs as `step=N` and
  Megatron-DeepSpeed as `iteration N` (the first step is 1; records before it, `initialize`'s
  broadcasts, are step 0). An agent attached mid-run numbers steps as the job does. Samples are the
  engine's `global_samples` delta (micro batch x grad accumulation x DP); `applied` is
  `engine.was_step_applied()` (false for an fp16 overflow; skipped steps are counted by DeepSpeed too).
  A wrapper of `DeepSpeedEngine.forward` notices the engine before its first boundary.
- Megatron optimizers (`megatron.core.optimizer`, not torch Optimizers): their own `step`, whose
  result says whether the update was applied (a skipped fp16 step never reaches the torch optimizer).
  Numbered by Megatron's `args.iteration + 1` (its training loop's `iteration` for the step in
  progress) where its global args exist, else counted on from the previous step.
- torch's global optimizer step post-hook for plain torch loops, numbered by the program's own counter
  where one is found (its loop variable, else the optimizer's update count; `steps_origin.py`), else
  from 0 at install. The source is written as the `step_origin` meta (`deepspeed`, `megatron`,
  `loop:NAME`, `optimizer`, or `attach` where the numbers count from the moment of attach).
Nesting (a DeepSpeed or Megatron step running a torch optimizer inside) is counted once: only the
outermost source emits. While DeepSpeed is loaded, torch hooks are ignored unless no engine shows up
within `TORCH_GRACE` of them (then the job trains without the engine; those first steps are lost).
The first step seen has no previous boundary, so its `dur` is null and its `ts` the install time.
Modules imported after install are patched by the writer thread within a flush interval (0.2 s), so
a job started under `diag run` has DeepSpeed's engine wrapped before its first step (its first fp16
steps overflow and never reach a torch optimizer step), and at the next torch optimizer step.
"""

from __future__ import annotations

import dis
import gc
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from diag.collectors.boundary import DsBoundary, Part
from diag.collectors.steps_origin import ProgramCounter

from diag import schema
from diag.agent.api import AgentAPI
from diag.agent.undo import Undo

NAME = "steps"
DS_ENGINE = "deepspeed.runtime.engine"
MEGATRON_OPTIMIZER = "megatron.core.optimizer.optimizer"
WATCHED = {"deepspeed": DS_ENGINE, "megatron": MEGATRON_OPTIMIZER}  # what patch_loaded waits for
_now = time.perf_counter_ns
_STEP = schema.STEP
_NOT_SET = object()  # no class attribute is this
TORCH_GRACE = 2  # torch-hook steps without a DeepSpeed engine before they count
MEGATRON_ARGS = ("megatron.training.global_vars", "megatron.global_vars")  # Megatron-LM, -DeepSpeed


def ds_step(engine: Any) -> int:
    """DeepSpeed's number for the step in progress: its `global_steps` once the step is taken."""
    return int(engine.global_steps) + 1


def _returns_step_applied(fn: Any) -> bool:
    """Is `fn` DeepSpeed's `was_step_applied`, `return self._step_applied` and nothing else (read
    once, at patch time: another version's may compute it, and is then called)?"""
    try:
        ops = [(i.opname, i.argval) for i in dis.get_instructions(fn) if i.opname not in ("RESUME", "CACHE")]
    except TypeError:
        return False
    return ops == [("LOAD_FAST", "self"), ("LOAD_ATTR", "_step_applied"), ("RETURN_VALUE", None)]


def megatron_iteration() -> int | None:
    """Megatron's `iteration` for the step in progress (its loop sets `args.iteration` after each
    step), or None where no Megatron training loop has parsed its arguments."""
    for name in MEGATRON_ARGS:
        args = getattr(sys.modules.get(name), "_GLOBAL_ARGS", None)
        done = getattr(args, "iteration", None)
        if isinstance(done, int):
            return done + 1
    return None


def megatron_step_classes() -> list[type]:
    """Loaded Megatron optimizer classes that define a concrete `step` of their own."""
    base = getattr(sys.modules.get(MEGATRON_OPTIMIZER), "MegatronOptimizer", None)
    out, todo = [], [base] if base is not None else []
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        fn = cls.__dict__.get("step")
        if fn is not None and not getattr(fn, "__isabstractmethod__", False):
            out.append(cls)
    return out


def engine_class() -> Any:
    return getattr(sys.modules.get(DS_ENGINE), "DeepSpeedEngine", None)


def live_engines(cls: type) -> list[Any]:
    """The engines of `cls` (or a subclass: PipelineEngine) that exist already: an attach lands
    inside a running job, whose step in progress must carry its number before its next forward.
    One gc pass over the referrers of the classes, at install only (as the module tree walk does)."""
    classes: set[type] = set()
    todo = [cls]
    while todo:
        c = todo.pop()
        if c not in classes:
            classes.add(c)
            todo.extend(c.__subclasses__())
    found = gc.get_referrers(*classes)
    engines = [o for o in found if type(o) in classes and hasattr(o, "global_steps")]
    building = under_construction(engines) if engines else set()
    return [e for e in engines if id(e) not in building]


def under_construction(objs: list[Any]) -> set[int]:
    """ids of `objs` whose `__init__` runs on some thread now. The writer thread's scan of a job
    under `diag run` can land inside `deepspeed.initialize` (an attach, inside it on the main
    thread): such an engine has `global_steps` but not yet its layout (`dp_world_size`, a
    PipelineEngine's `num_stages`), so it is left to its first forward, which describes it whole."""
    ids = {id(o) for o in objs}  # (`objs` holds them alive: an id here is one of them)
    out: set[int] = set()
    for top in sys._current_frames().values():
        frame: Any = top
        while frame is not None:
            if frame.f_code.co_name == "__init__" and id(frame.f_locals.get("self")) in ids:
                out.add(id(frame.f_locals["self"]))
            frame = frame.f_back
    return out


def settled(done: set[str], watched: dict[str, str]) -> bool:
    """Nothing half-imported among `watched` ({done key: module name}): each module is absent, or
    it was patched. A module is in sys.modules while its body still runs (the classes not yet
    defined), so a scan that saw it half-done must run again even if sys.modules did not grow."""
    return all(key in done or name not in sys.modules for key, name in watched.items())


class _Steps:
    """Boundary state shared by the wrappers: nesting depth and the previous boundary's time."""

    def __init__(self, agent: AgentAPI, undo: Undo) -> None:
        self.agent, self.undo = agent, undo
        self.depth = 0
        self.t_install = agent.now()
        self.last_ts: int | None = None
        self.ignored_torch = 0
        self.counter = ProgramCounter()
        self.origin: str | None = None
        self.done: set[str] = set()
        self.modules_seen = -1  # len(sys.modules) at the last scan that found nothing half-imported
        self._patching = threading.Lock()  # the training thread and the writer thread both patch
        self.seen: weakref.WeakSet[Any] = weakref.WeakSet()  # engines described so far
        self.last_engine: Any = lambda: None  # weak ref to the engine seen last: one identity test a call
        self.ds: DsBoundary | None = None  # DeepSpeed's boundary, once its engine is loaded
        self.after_megatron = agent.guard(NAME, self._after_megatron, "megatron-after")
        self.sight = agent.guard(NAME, self._sight, "engine-sight")
        self.number_megatron = agent.guard(NAME, self._number_megatron, "megatron-before")
        self.torch_post = agent.guard(NAME, self._torch_post, "torch-post")
        self.torch_hook: Any = None  # the optimizer post-hook's handle, dropped once an engine is seen
        self.stock_applied: Any = _NOT_SET  # DeepSpeedEngine's own was_step_applied, once patched

    # ---- patching --------------------------------------------------------------------------
    def patch_loaded(self) -> bool:
        """Wrap what is imported now; called at install, by the writer thread every flush (a
        framework imported after install: `diag run`) and at each torch step."""
        if len(self.done) == 2 or len(sys.modules) == self.modules_seen:
            return True  # nothing imported since the last complete scan (a step and a flush each ask)
        with self._patching:
            count = len(sys.modules)
            self._patch_loaded()
            if settled(self.done, WATCHED):
                self.modules_seen = count
                return True
        return False

    def _patch_loaded(self) -> None:
        cls = engine_class()
        if cls is not None and "deepspeed" not in self.done:
            self.done.add("deepspeed")
            self.ds = DsBoundary.of(self.agent, self.undo)  # shared with overflow: one wrapper
            self.ds.add(Part(1, NAME, None, self._after_engine))  # the counters alone, after overflow
            self.ds.patch(cls)
            stock = cls.__dict__.get("was_step_applied")
            if _returns_step_applied(stock):
                self.stock_applied = stock
            self.undo.patch(cls, "forward", self._wrap_forward(cls.forward))
            for engine in live_engines(cls):  # attached inside a step: number it now, not at 0
                self.sight(engine)
        if "megatron" not in self.done and MEGATRON_OPTIMIZER in sys.modules:
            self.done.add("megatron")
            for mcls in megatron_step_classes():
                self.undo.patch(mcls, "step", self._wrap_megatron(mcls.__dict__["step"]))

    def _wrap_forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        state = self

        def forward(engine: Any, *args: Any, **kwargs: Any) -> Any:
            if engine is not state.last_engine() and engine not in state.seen:
                state.sight(engine)
            return original(engine, *args, **kwargs)

        forward.__wrapped__ = original  # type: ignore[attr-defined]
        return forward

    def _wrap_megatron(self, original: Callable[..., Any]) -> Callable[..., Any]:
        state = self

        def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            outer = state.depth == 0 and not (state.ds and state.ds.depth)
            if outer:  # not inside another step (DeepSpeed's boundary counts it)
                state.number_megatron()
            state.depth += 1
            try:
                out = original(optimizer, *args, **kwargs)
            finally:
                state.depth -= 1
            if outer:
                state.after_megatron(out)
            return out

        step.__wrapped__ = original  # type: ignore[attr-defined]
        return step

    # ---- hooks (guarded) ---------------------------------------------------------------------
    def _sight(self, engine: Any) -> None:
        """First forward of an engine: record its layout; number the step in progress its way.

        A step already under way is not sampled for layers: its records would be partial."""
        self.see(engine)
        self.agent.step = ds_step(engine)
        self.say_origin("deepspeed")

    def see(self, engine: Any) -> None:
        """An engine's first sight. From now on the engine numbers the steps and `_torch_post` only
        returns, so torch's optimizer hook is removed: one call fewer on every step (~12 us in a
        job, where a hook's code runs cold between the job's kernels)."""
        self.seen.add(engine)
        self.last_engine = weakref.ref(engine)
        self.agent.saw_engine(engine)
        if self.torch_hook is not None:
            self.torch_hook.remove()  # idempotent: undo's own remove at detach finds it gone
            self.torch_hook = None

    def _number_megatron(self) -> None:
        """Before a Megatron optimizer step: take the loop's own iteration number, if it has one
        (the scaler's overflow record, inside the step, carries it too)."""
        iteration = megatron_iteration()
        if iteration is not None:
            self.agent.step = iteration
        self.say_origin("megatron" if iteration is not None else "attach")

    def _after_engine(self, engine: Any, before: tuple[int, int]) -> None:
        """The engine's step is over: its record, then the next step begins. `boundary` inline and
        DeepSpeed's own `was_step_applied` read as the flag it returns: two calls fewer, ~3 us where
        the hook runs cold."""
        taken = engine.global_steps
        if taken == before[0]:
            return  # not a boundary (`step` fallback between accumulation boundaries)
        if (
            engine is not self.last_engine() and engine not in self.seen
        ):  # attached inside a step: no forward yet
            self.see(engine)
        samples = engine.global_samples - before[1]
        if getattr(type(engine), "was_step_applied", None) is self.stock_applied:
            applied: bool | None = bool(engine._step_applied)
        else:  # another DeepSpeed's, or a subclass's own
            was_applied = getattr(engine, "was_step_applied", None)
            applied = bool(was_applied()) if was_applied is not None else None
        if self.origin != "deepspeed":
            self.say_origin("deepspeed")
        now = _now()
        prev, self.last_ts = self.last_ts, now
        dur = None if prev is None else now - prev
        agent = self.agent
        start = self.t_install if prev is None else prev
        agent.emit((_STEP, before[0] + 1, start, dur, samples or None, None, applied))
        agent.begin_step(int(taken) + 1)  # ds_step's number

    def _after_megatron(self, out: Any) -> None:
        applied = bool(out[0]) if isinstance(out, tuple) and out else None
        self.boundary(self.agent.step, None, applied, self.agent.step + 1)

    def _torch_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if len(self.done) < 2:
            self.patch_loaded()
        if self.depth or self.agent.engine is not None or (self.ds and self.ds.depth):
            return
        if "deepspeed" in self.done and self.ignored_torch < TORCH_GRACE:
            self.ignored_torch += 1  # an engine may be running this optimizer: wait for it
            return
        step, origin = self.counter.number(optimizer, sys._getframe(1))
        self.say_origin(origin)
        self.boundary(step, None, True, step + 1)

    def say_origin(self, origin: str) -> None:
        """Write where step numbers come from (`step_origin` meta) when it changes."""
        if origin != self.origin:
            self.origin = origin
            self.agent.set_meta(schema.META_STEP_ORIGIN, origin)

    def boundary(self, step: int, samples: int | None, applied: bool | None, next_step: int) -> None:
        now = _now()  # agent.now's clock, one call fewer
        prev, self.last_ts = self.last_ts, now
        start = self.t_install if prev is None else prev
        dur = None if prev is None else now - prev
        self.agent.emit((_STEP, step, start, dur, samples, None, applied))
        self.agent.begin_step(next_step)


def install(agent: AgentAPI, undo: Undo) -> None:
    """Wrap DeepSpeed / Megatron steps that are loaded now and hook torch's optimizer steps."""
    import torch.optim.optimizer as topt

    state = _Steps(agent, undo)
    state.patch_loaded()
    late = agent.guard(NAME, state.patch_loaded, "late-install")
    agent.idle_listeners.append(late)  # cleared by the agent's stop
    if not state.seen:  # an engine already running (attach) numbers the steps: no torch hook
        hook = topt.register_optimizer_step_post_hook(state.torch_post)
        state.torch_hook = undo.hook(hook, "torch optimizer post-hook")
