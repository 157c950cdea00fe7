"""Collectives and p2p ops: one `comm` record per call DeepSpeed, Megatron or the job makes.

The collector (this module) and its parts: `ops` (the ProcessGroup methods and their payloads),
`groups` (names by role), `timing` (completion), `dispatch` (calls from C++, at the c10d dispatcher).

DeepSpeed's TorchBackend and Megatron's mappings hold references to torch.distributed functions
taken at import time, so wrapping those functions misses calls. Every one of them ends in one method
of the `ProcessGroup` class (`collectors.comms.ops` lists them), so the class methods are wrapped
instead: that also catches groups created before the agent started (attach), and records each call
once. A wrapper calls the original exactly once and returns or raises what it does; diag's own work
runs before and after it inside `agent.guard`, so a failure there is counted, never raised.

Record: (comm, step, op, bytes, dtype, group, group_size, group_ranks, ts, dur, module, async_op);
`ts` is the issue time, `dur` a `Later` set at completion (`collectors.comms.timing`), `module` the
innermost module running (`collectors.modules`) on a tracked step. Module tracking costs too much
for every step, but a job issues the same collectives step after step: on the other steps a
collective takes the module of its match in the last tracked step, the same (op, bytes, group) and
the same occurrence of it within the step (`Matched`); one with no match keeps None (a
`attribution` meta record says "matched"). The match is made by the writer thread, in record order,
before the record is written (`agent.resolvers`): the hook only notes the module running, or that the
step is not tracked (`UNTRACKED`), which takes ~7 us off each collective where hooks run cold. The hot
path builds that one tuple; group name and ranks are cached per group, dtype names per dtype.
Groups are named by their role (`tp:1`, `dp:5`, `world:0`: collectors.comms.groups), and every
group seen is in the `groups` meta record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from diag.collectors.comms import dispatch
from diag.collectors.comms.groups import Groups
from diag.collectors.comms.ops import DTYPE_NAMES, METHODS, Spec, call_payload, dtype_name, is_async
from diag.collectors.comms.timing import CPU_CALL, CommTiming, Later

from diag import schema
from diag.agent import pending
from diag.agent.api import AgentAPI
from diag.agent.undo import Undo

NAME = "comms"
_COMM = schema.COMM
# a record: (_COMM, step, op, nbytes, dtype, group, size, ranks, ts, dur, module, async_op); its
# duration (a `Later`) is its only Pending field
RECORD_LEN, DUR_AT, MODULE_AT = 12, 9, 10
UNTRACKED: Any = ("untracked",)  # the module a hook notes on a step not tracked: matched later
FROM_CPP: Any = ("from C++",)  # ... for a call C++ issued: no module, and no match
_now = time.perf_counter_ns

State = tuple[int, Any, Later]  # (bytes, first tensor, duration) read before a call that may be on a GPU
Key = tuple[str, int, str]


class _Untracked:
    """The module tracker where torch has no module hooks: no step is tracked."""

    tracking = False

    def track_again(self) -> None:
        pass


class Matched:
    """Modules of the last tracked step's collectives by (op, bytes, group) and occurrence; the
    current step's occurrences so far."""

    __slots__ = ("learning", "seen", "step", "template", "tracker")

    def __init__(self, tracker: Any = None) -> None:
        # `tracker.tracking`: is this step tracked (the module stack is kept)? A collective with
        # no match asks the tracker to track the next step (`track_again`)
        self.tracker: Any = tracker if tracker is not None else _Untracked()
        self.step: int | None = None
        self.seen: dict[Key, int] = {}
        self.template: dict[tuple[Key, int], str | None] = {}
        self.learning: dict[tuple[Key, int], str | None] = {}

    def resolve(self, rec: tuple[Any, ...]) -> tuple[Any, ...]:
        """Writer thread: the record with its module (`rec[MODULE_AT]` as the hook noted it: a
        module name or None as tracked, `UNTRACKED`, or `FROM_CPP`: no module, no match)."""
        raw = rec[MODULE_AT]
        if raw is FROM_CPP:
            module = None
        else:
            try:
                module = self.module(rec[1], (rec[2], rec[3], rec[5]), raw)
            except Exception:  # noqa: BLE001 - written without a module rather than lost
                module = None
        return (*rec[:MODULE_AT], module, *rec[MODULE_AT + 1 :])

    def module(self, step: int, key: Key, module: Any) -> str | None:
        """`module` as tracked (learned for later steps; None: issued outside any module, as the
        optimizer's collectives are), else (`UNTRACKED`) the match's from the last tracked step."""
        if step != self.step:
            self.step, self.seen = step, {}
            if self.learning:
                self.template, self.learning = self.learning, {}
        seen = self.seen
        n = seen.get(key, 0)
        seen[key] = n + 1
        at = (key, n)
        if module is not UNTRACKED:
            self.learning[at] = module
            return module  # type: ignore[no-any-return]
        template = self.template
        if at in template:
            return template[at]
        self.tracker.track_again()
        return None


def install(agent: AgentAPI, undo: Undo, timing: CommTiming | None = None) -> None:
    """Wrap every collective method of `ProcessGroup` (those this torch has)."""
    from torch.distributed import ProcessGroup

    tracker = _track_modules(agent, undo)
    pending.declare_spot(_COMM, RECORD_LEN, DUR_AT)
    timing = timing or CommTiming(agent)
    timing.install(undo)
    agent.state.put(timing)  # found by tests (its `Work.wait` wrapper comes when a call needs it)
    groups = Groups(lambda seen: _new_group(agent, seen), agent.unsettle)
    undo.call(groups.clear, "comms: group cache")
    agent.idle_listeners.append(agent.guard(NAME, groups.recheck, "groups-recheck"))  # cleared by stop
    matched = Matched(tracker)
    agent.resolvers[_COMM] = matched.resolve  # before any hook: no record goes unresolved
    agent.set_meta(schema.META_ATTRIBUTION, "matched")
    flop_seam = _flop_mode_seam()

    def recorder(name: str) -> tuple[Any, Any] | None:
        spec = METHODS.get(name)
        return None if spec is None else _recorder(agent, spec, groups, timing, matched, from_cpp=True)

    for name, spec in METHODS.items():
        if name in ProcessGroup.__dict__:
            original = getattr(ProcessGroup, name)
            parts = _recorder(agent, spec, groups, timing, matched)
            wrapper = _wrapper(agent, name, original, parts, flop_seam, timing)
            undo.patch(ProcessGroup, name, wrapper)
    # what C++ calls (DDP's reducer) never passes the wrappers above: seen at the c10d dispatcher
    dispatch.register(
        undo,
        recorder,
        lambda fn, where: agent.guard(NAME, fn, where),
        _runner(flop_seam),
        timing.may_be_gpu,
    )


LAYOUT_ROLES = schema.PARALLEL_KEYS


def _new_group(agent: Any, seen: dict[str, dict[str, Any]]) -> None:
    """Every group seen so far as meta; the first group of a parallel role also gives its size to the
    layout (`tp`, ...), for jobs whose framework the header cannot read (Megatron-DeepSpeed's mpu)."""
    agent.set_meta(schema.META_GROUPS, seen)
    name = next(reversed(seen))
    role, size = seen[name]["role"], seen[name]["size"]
    if role in LAYOUT_ROLES and not any(g["role"] == role for n, g in seen.items() if n != name):
        agent.set_meta(role, size)


def _track_modules(agent: AgentAPI, undo: Undo) -> Any:
    """Module attribution needs `agent.module_stack` maintained (shared with the layers collector);
    the tracker, or None without torch's module hooks."""
    try:
        from diag.collectors import modules
    except ImportError:
        return None
    return modules.ensure_installed(agent, undo)


def _recorder(
    agent: AgentAPI,
    spec: Spec,
    groups: Groups,
    timing: CommTiming,
    matched: Matched,
    from_cpp: bool = False,
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(before, after) of one kind of call, shared by the class-method wrappers and the dispatcher
    kernels. The caller reads the clock before the call (`t0`, the record's ts) and runs `before`
    only where the call may be on a GPU (`CommTiming.may_be_gpu`: its CUDA start event must be on
    the stream before the collective); `after` does the rest: on CPU the whole record is one hook
    (a hook runs cold between the job's calls: ~15 us of CPU each in bench/overhead's job).
    A call C++ issues (`from_cpp`: DDP's reducer, when a bucket's last gradient is ready) carries no
    module: the module whose backward then runs produced one gradient of the bucket, not its data (a
    nanoGPT bucket of all 108,352 parameters was `transformer.wte`'s: a false embedding_comm)."""
    start, op, times_n, p2p = timing.start, spec.op, spec.times_n, spec.p2p
    arg_at, opts_at = spec.arg, spec.opts
    cpu, bind, group_info, tracker, blocked = (
        timing.cpu,
        timing.bind,
        groups.info,
        matched.tracker,
        timing.blocked,
    )
    cache, names, emit, tensor_type = groups.cache, DTYPE_NAMES, agent.emit, torch.Tensor
    new_later = object.__new__

    def before(t0: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> State:
        nbytes, tensor = call_payload(spec, args, kwargs)
        return nbytes, tensor, start(tensor, t0)

    def after(
        t0: int, state: Any, pg: Any, work: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Later | None:
        # one function, its helpers' common cases inline: a hook runs cold between the job's calls,
        # where each call and each object it touches costs (~34 -> ~28 us a call of CPU in the
        # bench's job, side by side)
        async_op: bool | None
        if state is CPU_CALL:  # not on a GPU: timed by the wall clock from t0
            x = args[arg_at] if arg_at is not None and len(args) > arg_at else None
            if type(x) is list and len(x) == 1:  # a list of one tensor (all_reduce) ...
                x = x[0]
            if isinstance(x, tensor_type):  # ... or one tensor (all_gather_into_tensor)
                tensor = x
                nbytes = x.nbytes
            else:
                nbytes, tensor = call_payload(spec, args, kwargs)
            later = new_later(Later)  # `Later(cpu, t0)` without its __init__ frame
            later.timer, later.token, later.dur = cpu, t0, None
        else:
            nbytes, tensor, later = state
        hit = cache.get(id(pg))
        group, size, ranks = hit[1] if hit is not None and hit[0]() is pg else group_info(pg)
        step = agent.step
        if times_n:
            nbytes *= size
        module: Any
        if from_cpp:
            module, async_op = FROM_CPP, True
        else:
            if tracker.tracking:
                stack = agent.module_stack
                module = stack[-1] if stack else None
            else:
                module = UNTRACKED
            opts = args[opts_at] if opts_at is not None and len(args) > opts_at else None
            async_op = getattr(opts, "asyncOp", None) if opts is not None else is_async(spec, args, kwargs)
        dtype = None if tensor is None else names.get(tensor.dtype) or dtype_name(tensor)
        emit((_COMM, step, op, nbytes, dtype, group, size, ranks, t0, later, module, async_op))
        if async_op is False and later.timer is cpu and work is not None and not p2p:
            blocked.add(later)  # in flight until the wrapper's wait returns (a detach counts it)
            return later  # blocking, on the wall clock: the wrapper waits for it (timing's doc)
        bind(work, later, p2p, async_op, pg)
        return None

    return before, after


def _wrapper(
    agent: AgentAPI,
    name: str,
    original: Callable[..., Any],
    parts: tuple[Callable[..., Any], Callable[..., Any]],
    flop_seam: tuple[Callable[[], bool], Callable[[], Any]],
    timing: CommTiming,
) -> Callable[..., Any]:
    may_be_gpu, blocked = timing.may_be_gpu, timing.blocked
    guarded_before = agent.guard(NAME, parts[0], name)
    guarded_after = agent.guard(NAME, parts[1], name)
    flop_mode_on_top, below_it = flop_seam
    mark = dispatch.marked
    below_autograd = torch._C._AutoDispatchBelowAutograd
    wait = torch._C._distributed_c10d.Work.wait  # the original: diag's wrapper, if any, is not needed

    def wrapper(pg: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        state = guarded_before(t0, args, kwargs) if may_be_gpu() else CPU_CALL
        outer = getattr(mark, "on", False)
        mark.on = True  # the c10d kernel below leaves this call to us
        try:
            # below autograd, as the dispatcher kernel would run it (c10d ops have only autograd's
            # fallback there): the kernel, a Python re-entry of ~100 us a call, is skipped
            with below_autograd():
                if flop_mode_on_top():  # a sampled step: run it below diag's FLOP counter, which
                    with below_it():  # counts nothing in it, or torch.profiler records it twice
                        work = original(pg, *args, **kwargs)
                else:
                    work = original(pg, *args, **kwargs)
        finally:
            mark.on = outer
        if state is not None:  # None: `before` failed (counted)
            blocking = guarded_after(t0, state, pg, work, args, kwargs)
            if blocking is not None:  # torch waits for it next: wait here, the end read as it returns
                wait(work)  # (what it raises is the job's, as torch's own wait would raise it)
                blocking.finish(_now())  # a no-op if a stop gave it up meanwhile (unfinished)
                blocked.discard(blocking)
        return work

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _runner(
    flop_seam: tuple[Callable[[], bool], Callable[[], Any]],
) -> Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]:
    """Run a dispatcher op as the wrappers do: below diag's FLOP counter on sampled steps."""
    on_top, below_it = flop_seam

    def run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if on_top():
            with below_it():
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return run


def _flop_mode_seam() -> tuple[Callable[[], bool], Callable[[], Any]]:
    """(is the layers collector's FlopMode the innermost dispatch mode of this thread, a context that
    pops it for the call). ~0.1 us per collective when no mode is pushed: one C++ stack-length read."""
    from diag.collectors.layers import FlopMode
    from torch._C import _len_torch_dispatch_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

    def on_top() -> bool:
        return bool(_len_torch_dispatch_stack()) and type(_get_current_dispatch_mode()) is FlopMode

    return on_top, _pop_mode_temporarily
