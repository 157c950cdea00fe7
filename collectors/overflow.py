"""Loss-scale updates and non-finite values: one `overflow` record per optimizer step with a scaler.

DeepSpeed fp16 (every ZeRO stage, pipeline too): a class-level wrapper of
`DeepSpeedEngine._take_model_step` (one wrapper shared with steps: collectors/boundary.py) reads
the loss scale before and after (`loss_scale_config.cur_scale` at stage 0, `loss_scaler.cur_scale`
under ZeRO: host floats), the optimizer's `overflow` flag and `engine.skipped_steps`; source
"deepspeed_fp16"; numbered as collectors/steps.py numbers steps (DeepSpeed's `global_steps` once
taken), so they are the log's skipped iterations. One wrapper at the boundary covers every
optimizer type, where `DynamicLossScaler.update_scale` / `FP16_UnfusedOptimizer._update_scale` /
`has_overflow` differ per optimizer and stage.
Megatron: `DynamicGradScaler.update(found_inf)` (and `ConstantGradScaler`); found_inf is already a
host bool, the scale a device tensor copied asynchronously (`device.host_scalar`), never `.item()`;
`skipped_steps` counts found_inf updates since install (Megatron keeps no such counter); source
"megatron".
bf16 / fp32: a record when the loss (`engine.backward`) or the global grad norm (the engine's cached
`_global_grad_norm`, a Megatron step's returned norm) is non-finite, checked only where the value is
already on the host; sources "nonfinite_loss" / "nonfinite_grad_norm". DeepSpeed's losses are looked
at from `backward` to the step's boundary (weak references: the job's own loop holds its loss that
long, and a loss it let go is not kept; one on the device, never read here, is not kept at all) and
read there only when the grad norm is not on the host or not finite: a non-finite loss makes every
gradient, so the norm, non-finite, and reading each loss (`item()`, ~20 us a step in a job) told
nothing more.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from diag.collectors import device
from diag.collectors.boundary import PLAIN, DsBoundary, Part
from diag.collectors.steps import DS_ENGINE, engine_class, megatron_step_classes, settled

from diag import schema
from diag.agent.api import AgentAPI, StepListener
from diag.agent.undo import Undo

NAME = "overflow"
GRAD_SCALER = "megatron.core.optimizer.grad_scaler"
WATCHED = {"deepspeed": DS_ENGINE, "megatron": GRAD_SCALER}
MAX_LOSSES = 64  # micro-batch losses kept per step (gradient accumulation), the first ones
_ref = weakref.ref
_isfinite = math.isfinite
_host_float = device.host_float


def _around(
    original: Callable[..., Any], before: Callable[..., Any], after: Callable[..., Any]
) -> Callable[..., Any]:
    """A method wrapper: `after(self, token, result, *args)` with the token `before(self, *args)` gave."""

    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
        token = before(obj, *args, **kwargs)
        out = original(obj, *args, **kwargs)
        after(obj, token, out, *args, **kwargs)
        return out

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _first(original: Callable[..., Any], before: Callable[..., Any]) -> Callable[..., Any]:
    """A method wrapper that only looks before the call (`engine.backward`, once per micro-batch:
    no call to a do-nothing `after`, ~1 us in a job where the hook runs cold)."""

    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
        before(obj, *args, **kwargs)
        return original(obj, *args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _after_loss(fn: Callable[..., Any], name: str) -> int | None:
    """Index of parameter `name` among `fn(self, loss, ...)`'s positional args after the loss (its
    place moved across DeepSpeed versions), None where it has none."""
    try:
        # a decorator without functools.wraps (DeepSpeed's instrument_w_nvtx) shows (*args, **kwargs):
        # the function it calls is the one in its closure
        for _ in range(3):
            names = list(inspect.signature(fn).parameters)
            inner = [c.cell_contents for c in fn.__closure__ or () if inspect.isfunction(c.cell_contents)]
            if name in names or len(inner) != 1:
                break
            fn = inner[0]
    except (TypeError, ValueError, AttributeError):
        return None
    return names.index(name) - 2 if name in names[2:] else None


def _held(loss: Any) -> Callable[[], Any]:
    """A loss without weak references (a plain number) is kept: there is nothing behind it. A
    tensor is held by a weak reference (`_loss_check`): one the job let go is neither kept alive
    nor freed inside our hook."""
    return lambda: loss


def _nonfinite(value: Any) -> bool:
    v = device.host_float(value)
    return v is not None and not math.isfinite(v)


class _Overflow:
    def __init__(self, agent: AgentAPI, undo: Undo) -> None:
        self.agent, self.undo = agent, undo
        self.done: set[str] = set()
        self.modules_seen = -1  # len(sys.modules) at the last scan that found nothing half-imported
        self._patching = threading.Lock()  # the training thread and the writer thread both patch
        self.megatron_skipped = 0
        self.losses: list[Callable[[], Any]] = []  # weak refs to DeepSpeed's losses since the boundary
        self.retain_at: int | None = None  # `retain_graph`'s place among backward's args after the loss
        # (weak ref to an engine, its fp16_enabled()): fixed by its config; read once, not at each
        # backward and boundary (a DeepSpeed method, ~3 us where the hook runs cold)
        self.fp16_of: tuple[Callable[[], Any], bool] = (_gone, False)
        g = agent.guard
        self.loss_check = g(NAME, self._loss_check)
        self.mg_before, self.mg_after = g(NAME, self._mg_before), g(NAME, self._mg_after)
        self.mg_step_after = g(NAME, self._mg_step_after)

    def patch_loaded(self, _step: int = 0) -> bool:
        """Wrap what is imported now; also a step listener and a writer-thread listener, for
        modules imported later (before the job's first step: its first fp16 steps may overflow)."""
        if len(self.done) == 2 or len(sys.modules) == self.modules_seen:
            return True  # nothing imported since the last complete scan
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
            boundary = DsBoundary.of(self.agent, self.undo)  # shared with steps: one wrapper
            boundary.add(Part(0, NAME, self._ds_before, self._ds_after))
            boundary.patch(cls)
            self.retain_at = _after_loss(cls.backward, "retain_graph")
            self.undo.patch(cls, "backward", _first(cls.backward, self.loss_check))
        scalers = sys.modules.get(GRAD_SCALER)
        if scalers is not None and "megatron" not in self.done:
            self.done.add("megatron")
            for sname in ("DynamicGradScaler", "ConstantGradScaler"):
                scls = getattr(scalers, sname, None)
                if scls is not None and "update" in scls.__dict__:
                    self.undo.patch(scls, "update", _around(scls.update, self.mg_before, self.mg_after))
            for mcls in megatron_step_classes():
                self.undo.patch(mcls, "step", _around(mcls.__dict__["step"], _nothing, self.mg_step_after))

    def emit(
        self, step: int, overflow: bool, before: Any, after: Any, skipped: int | None, source: str
    ) -> None:
        self.agent.emit((schema.OVERFLOW, step, self.agent.now(), overflow, before, after, skipped, source))

    # ---- DeepSpeed ---------------------------------------------------------------------------
    def fp16(self, engine: Any) -> bool:
        """The engine's `fp16_enabled()`, asked once per engine."""
        known = self.fp16_of
        if known[0]() is engine:
            return known[1]
        fp16 = bool(engine.fp16_enabled())
        try:
            self.fp16_of = (weakref.ref(engine), fp16)
        except TypeError:  # no weak references to it: asked each time
            pass
        return fp16

    def _ds_before(self, engine: Any) -> Any:
        """fp16: (global_steps, the loss scale before the step, True); else `PLAIN` (the boundary's
        counters are all `_ds_after` reads: `global_steps` first)."""
        known = self.fp16_of
        if not (known[1] if known[0]() is engine else self.fp16(engine)):
            return PLAIN
        scale = device.host_float(engine._get_optimizer_loss_scale())
        return int(engine.global_steps), scale, True

    def _ds_after(self, engine: Any, token: tuple[Any, ...]) -> None:
        """The step's record where it has one. bf16 / fp32: only the grad norm is read (its value
        decides), `skipped_steps` and the losses only for a record (a hook runs cold: each read and
        call costs ~0.5-2 us there)."""
        if engine.global_steps == token[0]:
            return
        if len(token) == 3:  # fp16, as `_ds_before` found it (else the counters)
            overflow = bool(getattr(engine.optimizer, "overflow", False))
            after = device.host_float(engine._get_optimizer_loss_scale())
            self.emit(token[0] + 1, overflow, token[1], after, int(engine.skipped_steps), "deepspeed_fp16")
            return
        losses, self.losses = self.losses, []
        value: Any = getattr(engine, "_global_grad_norm", None)
        try:  # a CPU tensor (DeepSpeed's norm on CPU), read as `host_float` reads it, a call fewer
            norm = float(value.item()) if value.is_cpu is True else None
        except (AttributeError, RuntimeError, TypeError, ValueError):  # not a one-element tensor
            norm = _host_float(value)
        if norm is not None and _isfinite(norm):
            return  # the step's losses were finite too: nothing to read
        if norm is not None:
            self.emit(token[0] + 1, True, None, None, int(engine.skipped_steps), "nonfinite_grad_norm")
        if losses and any(_nonfinite(ref()) for ref in losses):
            self.emit(token[0] + 1, True, None, None, int(engine.skipped_steps), "nonfinite_loss")

    def _loss_check(self, engine: Any, loss: Any = None, *args: Any, **kwargs: Any) -> None:
        known = self.fp16_of
        if known[1] if known[0]() is engine else self.fp16(engine):
            return
        if (args or kwargs) and self._retains(args, kwargs):
            if _nonfinite(loss):  # a kept graph keeps its activations: read now, keep nothing
                self.emit(
                    int(engine.global_steps) + 1,
                    True,
                    None,
                    None,
                    int(engine.skipped_steps),
                    "nonfinite_loss",
                )
            return
        losses = self.losses
        if len(losses) < MAX_LOSSES and getattr(loss, "is_cpu", True) is not False:  # else never read
            try:  # read at the boundary, if at all
                losses.append(_ref(loss))
            except TypeError:  # a plain number (no weak references): nothing behind it to free
                losses.append(_held(loss))

    def _retains(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """backward(loss, ..., retain_graph=True), by keyword or at its place for this DeepSpeed."""
        at = self.retain_at
        return bool(kwargs.get("retain_graph") or (at is not None and len(args) > at and args[at]))

    # ---- Megatron ----------------------------------------------------------------------------
    def _mg_before(self, scaler: Any, *_a: Any, **_k: Any) -> tuple[Any, Any]:
        tensor = scaler._scale
        return tensor, device.host_scalar(tensor)

    def _mg_after(
        self,
        scaler: Any,
        token: tuple[Any, Any] | None,
        _out: Any,
        found_inf: Any = False,
        *_a: Any,
        **_k: Any,
    ) -> None:
        if token is None:
            return
        tensor, before = token
        after = before if scaler._scale is tensor else device.host_scalar(scaler._scale)
        if found_inf:
            self.megatron_skipped += 1
        self.emit(self.agent.step, bool(found_inf), before, after, self.megatron_skipped, "megatron")

    def _mg_step_after(self, optimizer: Any, _token: Any, out: Any, *_a: Any, **_k: Any) -> None:
        if getattr(optimizer, "grad_scaler", None) is not None or not isinstance(out, tuple):
            return  # a scaler's record covers this step
        if len(out) > 1 and _nonfinite(out[1]):
            self.emit(self.agent.step, True, None, None, self.megatron_skipped, "nonfinite_grad_norm")


def _nothing(*_a: Any, **_k: Any) -> None:
    return None


def _gone() -> None:
    """A dead weak reference's answer: no engine seen yet."""
    return None


def install(agent: AgentAPI, undo: Undo) -> None:
    """Wrap the loaded DeepSpeed engine / Megatron scalers; patch later imports at step boundaries
    until the job's framework is wrapped (then the writer thread's idle listener, within a flush,
    covers what is imported later: a step listener is a call on every step, ~3 us in a job)."""
    state = _Overflow(agent, undo)
    state.patch_loaded()
    listener: StepListener | None = None

    def late_install(step: int) -> None:
        if state.patch_loaded(step) and state.done:
            agent.step_listeners = [f for f in agent.step_listeners if f is not listener]  # not in place:
            # begin_step is iterating the list

    listener = StepListener(NAME, "late-install", late_install)
    agent.step_listeners.append(listener)
    agent.idle_listeners.append(agent.guard(NAME, state.patch_loaded, "late-install"))  # cleared by stop
    undo.call(
        lambda: agent.step_listeners.remove(listener) if listener in agent.step_listeners else None,
        "overflow: step listener",
    )
