"""Which module is running now, forward and backward: `agent.module_stack`, shared by the collectors.

Lets a collective (comms) or a layer record (layers) name the module it belongs to, on TRACKED steps
only: every per-layer sampled step, every `attribute_every`-th step (agent option,
see `AgentOptions`; 1 = every step, 0 = sampled steps only), the job's first `attribute_every`
steps (step numbers are the job's: a short job is attributed throughout, an attach mid-run is not),
the step after one whose collective found no match (comms asks: the job's pattern changed), and
every step until the first step boundary (an attach into a loop the steps collector does not
know). Any global module hook sends
every module call through torch's slow `Module.__call__` path (~1.5 us) and each backward hook costs
~3.6 us to register, so a step listener installs the global hooks at the start of a tracked step and
removes them at its end: untracked steps pay nothing, and their comms carry module=None. The trace
says which steps were tracked (an `attribute_every` meta record, then one `attributed_step` meta
record per tracked step), so readers compute module shares only over those steps.

Forward uses torch's global module hooks, which take effect on the training thread's next call even
when the agent starts from another thread (attach). Backward uses grad_fn pre-hooks, as
`torch/utils/module_tracker.py` does with multi-grad hooks but cheaper, and never global full-backward
hooks (they break the in-place ops of DeepSpeed and Megatron):

- a module's output node gets a pre-hook that *enters* the module when its gradient arrives: the
  stack becomes the module's forward path (root ... module);
- the node that produced its first positional input (as of the forward's end) gets a pre-hook that
  *exits* it (the gradient has reached the input, so the module's backward is done): the stack becomes
  the parent path;
- the end of each backward (an engine callback) restores the stack it found.

Backward moves are transitions between whole paths, so a missed exit (input passed by keyword or not
requiring grad, as for the first layer) only lasts until the next module's backward starts.
Modules returning their input unchanged (Megatron's IdentityOp) get no backward hooks at all.

Names are fully qualified (state_dict style, without the root's prefix, e.g. `layers.3.mlp.fc1`);
the root is named by its class (a DeepSpeedEngine's model is `module`, its blocks `module.layers.0`).
They are resolved once per new module (its root found through gc) and cached by id.
"""

from __future__ import annotations

import functools
import gc
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from diag.collectors.windows import Windows
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from diag import schema
from diag.agent.api import AgentAPI, StepListener
from diag.agent.undo import Undo

Path = tuple[str, ...]
Entry = tuple[weakref.ref, str, bool]
_graph_task_id = torch._C._current_graph_task_id
_exc_info = sys.exc_info
_Tensor = torch.Tensor
MAX_NAMES = 100_000  # cached names before dead (ephemeral) modules are dropped
_META_KEY = "diag_modules"  # our key in autograd Node.metadata
ATTRIBUTED_STEP = schema.META_ATTRIBUTED_STEP  # one meta record per tracked step (value: the step)
MISS_GAP = 10  # steps between two tracked steps asked for by unmatched collectives (`again`)


def ensure_installed(agent: AgentAPI, undo: Undo) -> ModuleTracker:
    """Install the tracker once per agent (layers and comms both call this); returns it."""
    tracker = agent.state.get(ModuleTracker)
    if tracker is None:
        tracker = ModuleTracker(agent)
        tracker.install(undo)
    return tracker


def _first_node(value: Any) -> Any:
    """grad_fn of the first tensor in a forward's args or output (a tensor, tuple or list)."""
    if type(value) is _Tensor or isinstance(value, _Tensor):
        return value.grad_fn
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, _Tensor):
                return item.grad_fn
    return None


class ModuleTracker:
    """Keeps `agent.module_stack` right; `listener` (the layers collector) hears every move."""

    def __init__(self, agent: AgentAPI) -> None:
        self.agent = agent
        self.stack: list[str] = agent.module_stack
        self.names: dict[int, Entry] = {}
        self.layer_numbers: dict[str, int] = {}  # stacked layers whose model-wide index differs
        self.roots: set[str] = set()  # names of the module trees' roots (their class names)
        self.live = False
        # has .active, .fwd(name, outermost, args), .fwd_end(name, raised), .bwd(old, new)
        self.listener: Any = None
        self._track: list[bool] = []  # per running module: attribute its backward? (parallel to stack)
        self._task = -1  # graph task whose end-of-backward callback is queued
        self._handling: dict[int, BaseException] = {}  # id(module) -> exception handled at its call
        self._lock = threading.Lock()
        self.every = agent.options.attribute_every
        self.again = False  # a collective found no match on an untracked step: track the next one
        self._last_again = -MISS_GAP
        self._handles: tuple[Any, Any] | None = None  # the global forward hooks while tracking
        self.tracking = False  # the hooks are on: module_stack is kept on this step
        self._switch = threading.Lock()
        guard = agent.guard
        self._hooks = guard("modules", self._pre, "fwd-pre"), guard("modules", self._post, "fwd-post")
        self.windows: Windows | None = None  # named windows around functions (collectors/windows.py)

    def install(self, undo: Undo) -> None:
        agent = self.agent
        agent.state.put(self)
        self.live = True
        undo.call(self._uninstall, "modules.state")
        self.windows = Windows(self, agent, undo)
        self.windows.scan()
        agent.set_meta(schema.META_ATTRIBUTE_EVERY, self.every)
        self._hooks_on(agent.step)  # until the first step boundary: always on
        listener = StepListener("modules", "step", self.on_step)
        agent.step_listeners.append(listener)
        undo.call(
            lambda: agent.step_listeners.remove(listener) if listener in agent.step_listeners else None,
            "modules.step-listener",
        )

    def _uninstall(self) -> None:
        # under the switch: a boundary's `_hooks_on` past its `live` test has registered its hooks
        # before this, and `_hooks_off` removes them (they outlived a detach when it did not wait)
        with self._switch:
            self.live = False  # hooks still attached to live autograd graphs become no-ops
        self._hooks_off()
        self.listener = None
        self.stack.clear()
        self._track.clear()
        self.agent.state.remove(ModuleTracker)

    # ---- tracked steps ------------------------------------------------------------------------
    def tracked(self, step: int) -> bool:
        """Attribute this step? Sampled steps always (layers needs the tracker); else the job's first
        N steps (short jobs and tests get every step) and every Nth after them; and the step after
        one whose collective had no match to take its module from (`again`: the job's pattern
        changed), at most one such step in MISS_GAP."""
        every = self.every
        if self.agent.sampled or (every > 0 and (step < every or step % every == 0)):
            self.again = False
            return True
        if self.again and step - self._last_again >= MISS_GAP:
            self.again, self._last_again = False, step
            return True
        return False

    def track_again(self) -> None:
        """A collective of an untracked step had no match (comms): track the next step."""
        self.again = True

    def on_step(self, step: int) -> None:
        """Step boundary (step listener): hooks on for a tracked step, off for an untracked one;
        windows for functions of a framework imported since the last boundary."""
        windows = self.windows
        if windows is not None and len(sys.modules) != windows.modules_seen:
            windows.scan()
        every = self.every  # `tracked`'s cheap test first: most boundaries end here, one call fewer
        if (self.agent.sampled or self.again or (every > 0 and (step < every or step % every == 0))) and (
            self.tracked(step)
        ):
            self._hooks_on(step)
        elif self._handles is not None or self.tracking:  # else off already (most boundaries)
            self._hooks_off()

    def _hooks_on(self, step: int) -> None:
        agent = self.agent
        with self._switch:  # a detach thread's stop() may be turning them off right now
            if not self.live:
                return
            agent.emit((schema.META, agent.now(), ATTRIBUTED_STEP, step))
            if self._handles is None:
                pre, post = self._hooks
                # always_call: a forward that raises (a fused kernel's caught fallback) still ends
                self._handles = (
                    register_module_forward_pre_hook(pre),
                    register_module_forward_hook(post, always_call=True),
                )
            self.tracking = True

    def _hooks_off(self) -> None:
        if self._handles is None and not self.tracking:
            return  # off already: most boundaries (a lock and a few calls fewer per step)
        with self._switch:
            self.tracking = False
            handles, self._handles = self._handles, None
            if handles is not None:
                for handle in handles:
                    handle.remove()
                self.stack.clear()  # without the post-hook nothing would pop what is open now
                self._track.clear()
                self._handling.clear()

    # ---- forward (hot path: every module call of every step) --------------------------------
    def _pre(self, mod: Any, args: tuple[Any, ...]) -> None:
        entry = self.names.get(id(mod))
        if entry is None or entry[0]() is not mod:
            entry = self.entry_of(mod)
        handling = _exc_info()[1]
        if handling is not None:  # called from an except block (a retry): not this call's error
            self._handling[id(mod)] = handling
        self.begin(entry[1], entry[2], args)

    def _post(self, mod: Any, args: tuple[Any, ...], output: Any) -> None:
        entry = self.names.get(id(mod))
        # torch runs the always_call post-hook inside its except block when the forward raised:
        # an exception other than the one handled at the call is this forward's own
        exc = _exc_info()[1]
        held = self._handling.pop(id(mod), None) if self._handling else None
        self.end(entry[1] if entry is not None else None, args, output, exc is not None and exc is not held)

    def begin(self, name: str, leaf: bool, args: tuple[Any, ...]) -> None:
        """A module (or a named window, collectors/windows.py) starts its forward."""
        outermost = not self.stack
        self.stack.append(name)
        lis = self.listener
        if lis is not None and (lis.active or outermost):
            lis.fwd(name, outermost, args)
        # parameter-less leaves (activations, dropout) are skipped in backward unless sampled
        track = torch.is_grad_enabled() and (not leaf or (lis is not None and lis.active))
        self._track.append(track)

    def end(self, name: str | None, args: tuple[Any, ...], output: Any, raised: bool = False) -> None:
        """A module (or a named window) ends its forward: its backward window is hooked. One that
        `raised` leaves no record (Megatron-DeepSpeed calls `self_attention` with a keyword, catches
        the TypeError and calls it again: one forward, not a 0-FLOP one before it)."""
        stack = self.stack
        if name is None or not stack or (stack[-1] != name and not self._unwind(name)):
            return  # started mid-forward (attach): this call's pre-hook never ran
        stack.pop()
        track = self._track.pop() if self._track else False
        lis = self.listener
        if lis is not None and lis.active:
            lis.fwd_end(name, raised)
        if not track or raised:
            return
        # the input's node as of now: an in-place op on a view of it (Megatron's masked_fill_)
        # replaces the node it had at the pre-hook, which would then never see a gradient
        in_node = _first_node(args)
        out_node = _first_node(output)
        if out_node is None or out_node is in_node:
            return  # no gradient flows through, or an identity module: nothing to attribute
        path = (*stack, name)
        self._on_node(out_node).append((self._enter, path))
        if in_node is not None:
            self._on_node(in_node).append((self._exit, path))

    def _unwind(self, name: str | None) -> bool:
        """`name` ends but is not on top: modules above it began and never ended (their post-hooks
        did not run). Close them now, so this module's window ends here and not at a later module's
        end (which popped the wrong name: a parent's window ran on, the root's never closed). False
        if `name` never began (hooks turned on inside it: an attach mid-forward)."""
        stack = self.stack
        if name is None or name not in stack:
            return False
        lis = self.listener
        while stack[-1] != name:
            above = stack.pop()
            if self._track:
                self._track.pop()
            if lis is not None and lis.active:
                lis.fwd_end(above)
        return True

    def _on_node(self, node: Any) -> list[tuple[Callable[[Path], None], Path]]:
        """The actions to run when backward reaches `node`: one pre-hook per node (registering costs
        ~3.6 us, appending ~0.1 us), the list kept in the node's own metadata dict."""
        meta = node.metadata
        actions = meta.get(_META_KEY)
        if actions is None:
            actions = meta[_META_KEY] = []
            node.register_prehook(functools.partial(self._run, actions))
        return actions

    # ---- backward ------------------------------------------------------------------------------
    def _run(self, actions: list[tuple[Callable[[Path], None], Path]], _grads: Any) -> None:
        if self.live:
            for action, path in actions:
                action(path)

    def _enter(self, path: Path) -> None:
        if tuple(self.stack[: len(path)]) != path:
            self._guarded(self._move, path)

    def _exit(self, path: Path) -> None:
        if tuple(self.stack[: len(path)]) == path:
            self._guarded(self._move, path[:-1])

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - never raise into the job's backward
            self.agent.record_error("modules", "bwd", exc)

    def _move(self, path: Path) -> None:
        task = _graph_task_id()
        if task != self._task and task != -1:
            torch.autograd.Variable._execution_engine.queue_callback(
                functools.partial(self._backward_done, self._task, tuple(self.stack))
            )
            self._task = task
        self._set(path)

    def _backward_done(self, outer_task: int, saved: Path) -> None:
        """End of one backward (nested ones, from reentrant checkpointing, restore the outer path)."""
        self._task = outer_task
        if self.live:
            self._guarded(self._set, saved)

    def _set(self, path: Path) -> None:
        lis = self.listener
        if lis is not None and lis.active:
            old = tuple(self.stack)
            self.stack[:] = path
            lis.bwd(old, path)
        else:
            self.stack[:] = path

    # ---- names (once per new module) -----------------------------------------------------------
    def name_of(self, mod: Any) -> str:
        """Fully qualified name of `mod` (cached)."""
        entry = self.names.get(id(mod))
        return entry[1] if entry is not None and entry[0]() is mod else self.entry_of(mod)[1]

    def entry_of(self, mod: Any) -> Entry:
        """Outside any module: index the whole tree of `mod`'s root (found through gc) once. Inside a
        known module, an unknown one is ephemeral (Megatron builds a `torch.nn.Softmax` per call):
        it is named after its caller, `<caller>.<Class>`, without a gc walk."""
        with self._lock:
            if self.stack:
                name = f"{self.stack[-1]}.{type(mod).__name__}"
            else:
                try:
                    self._index(_find_root(mod))
                except Exception as exc:  # noqa: BLE001 - an odd module tree: name it alone
                    self.agent.record_error("modules", "names", exc)
                entry = self.names.get(id(mod))
                if entry is not None and entry[0]() is mod:
                    return entry
                name = type(mod).__name__
            if len(self.names) > MAX_NAMES:
                self.names = {k: e for k, e in self.names.items() if e[0]() is not None}
            entry = self.names[id(mod)] = _entry(mod, name)
            return entry

    def _index(self, root: Any) -> None:
        if self.windows is not None:
            self.windows.pipeline(root)
        self.roots.add(type(root).__name__)
        self.names[id(root)] = _entry(root, type(root).__name__)
        renumbered: dict[str, int] = {}
        for name, sub in root.named_modules(remove_duplicate=True):
            if name:
                self.names[id(sub)] = _entry(sub, name)
                index = global_layer_index(name, sub)
                if index is not None:
                    renumbered[name] = index
        if renumbered:
            self.layer_numbers.update(renumbered)
            self.agent.set_meta(schema.META_LAYER_NUMBERS, dict(self.layer_numbers))


def global_layer_index(name: str, mod: Any) -> int | None:
    """The model-wide 0-based index of a stacked layer (`...layers.<i>`) when it differs from its
    local position `i`: a pipeline stage's megatron layers are numbered from 0 in each stage, and
    carry their place in the whole model as `layer_number` (1-based; megatron-core and Megatron-
    DeepSpeed alike). None for anything else."""
    parent, _, last = name.rpartition(".")
    if not last.isdigit() or not (parent == "layers" or parent.endswith(".layers")):
        return None
    number = getattr(mod, "layer_number", None)
    if type(number) is not int or number < 1 or number - 1 == int(last):
        return None
    return number - 1


def _entry(mod: Any, name: str) -> Entry:
    """(weak reference, qualified name, parameter-less leaf?)."""
    return weakref.ref(mod), name, not mod._parameters and not mod._modules


def _find_root(mod: Any) -> Any:
    """Walk up through the modules whose `_modules` dict holds `mod` (gc, once per new tree)."""
    seen = {id(mod)}
    while True:
        parent = _parent_of(mod)
        if parent is None or id(parent) in seen:
            return mod
        seen.add(id(parent))
        mod = parent


def _parent_of(mod: Any) -> Any:
    """The module whose `_modules` dict holds `mod`, or None (an instance dict may sit between)."""
    for holder in gc.get_referrers(mod):
        if type(holder) is not dict:
            continue
        for ref in gc.get_referrers(holder):
            owner = _module_owning(ref, holder)
            if owner is not None:
                return owner
    return None


def _module_owning(ref: Any, modules_dict: dict) -> Any:
    if isinstance(ref, torch.nn.Module):
        return ref if ref.__dict__.get("_modules") is modules_dict else None
    if type(ref) is dict and ref.get("_modules") is modules_dict:
        for owner in gc.get_referrers(ref):
            if isinstance(owner, torch.nn.Module) and owner.__dict__ is ref:
                return owner
    return None
