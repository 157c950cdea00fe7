"""The in-process agent: owns the ring, the writer thread, the installed collectors and their undo.

Threading: `start()` may be called from any thread (attach runs it on a fresh daemon thread while
the training loop keeps going). Collectors only install hooks and class-level wrappers, which take
effect on the training thread's next call. Hooks call `emit` (a bound `Ring.push`) and nothing else
that allocates much; all formatting happens on the writer thread.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from diag import schema
from diag.agent import faults as _faults
from diag.agent import fork as _fork
from diag.agent import pending as _pending
from diag.agent import uncaught as _uncaught
from diag.agent.api import CollectorState, Installer, StepListener
from diag.agent.header import (
    MEGATRON_STATE,
    VERSIONS,
    build_header,
    describe_job,
    late_versions,
    megatron_layout,
    rank_and_world,
)
from diag.agent.options import AgentOptions
from diag.agent.registry import COLLECTORS
from diag.agent.ring import Ring
from diag.agent.sched import SchedReader
from diag.agent.undo import Undo
from diag.agent.wakeup import Wakeup
from diag.thread_name import name_this_thread
from diag.trace.comm_line import DUR_AT, comm_line, comm_text, new_file
from diag.trace.comm_line import FIELDS as COMM_FIELDS
from diag.trace.flat_line import flat_text
from diag.trace.writer import TraceFileWriter, dumps, rank_file_name

# the writer's flushes: a record is in the file at most this late, on ticks of the wall clock, so
# every rank of a job (hosts in NTP sync) flushes at the same moments: a job killed at once leaves
# each rank's records ending at the same tick. A flush runs cold (the job's compute between two
# evicts the writer's code and data): ~130 us of the rank's CPU in bench/writer_cold whatever it
# writes, plus ~2.5 us a record; at 0.2 s that fixed part was 40-50 us of each ~60-100 ms step of
# bench/hooks_probe's job (writer ~100 us a rank-step), at 0.5 s ~65. The rules' margin for "this
# rank died first" (analyzers/liveness.FIRST_BY_S) is 2.5 intervals: ranks killed 0.15 s apart
# across a tick lose records one interval apart, not a death
FLUSH_INTERVAL_S = 0.5
# while an idle listener waits for a framework being imported (sys.modules grows), the writer wakes
# this often to run it, so a late import is patched before the job's first step; it writes on the
# flush ticks only
LISTEN_INTERVAL_S = 0.2
# a job whose step numbers at its first boundaries are at most this started with the agent (steps
# number from 0 or 1): the agent also samples its first steady step (`Agent._to_steady`)
FRESH_STEPS = 3
STATS_INTERVAL_S = 2.0
MAX_ERROR_MESSAGES = 20
_COMM = schema.COMM

ErrorKey = tuple[str, str, str]  # (collector, where, exception class name)


class Agent:
    """One per process. Collectors read and update the shared state below from their hooks, through
    `diag.agent.api.AgentAPI` (the part of this class they may use)."""

    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.trace_dir = options.resolved_trace_dir()
        self.what = options.what
        self.ring = Ring(options.ring_capacity)
        self.emit: Callable[[tuple[Any, ...]], None] = self.ring.push
        self.faults: dict[str, str] = dict(options.faults or _faults.from_env())
        # shared, hook-updated state
        self.step = 0  # index of the step in progress (steps collector)
        self.layers_every = options.layers_every  # 0: no sampled steps
        self.sampled = False  # is the current step a per-layer sampled step
        # boundaries until the first steady step, sampled too where the agent started with the job
        # (0: none). The first step (sampled whole, collectors/layers.py) has no duration and the
        # next is the analysis's warm-up (`steps.steady`): a short run's only sample was the first,
        # mostly waiting in its first collectives; a 12-step megatron-core run's step 1 took 609 ms
        # where steady ones took 90
        self._to_steady = 0 if options.joined else 2
        self.module_stack: list[str] = []  # qualified names of modules running now (fwd or bwd)
        self.step_listeners: list[StepListener] = []
        # run by the writer thread every flush: collectors that wrap a framework imported after the
        # agent started (`diag run`) patch it before the job's first step, not at its first boundary
        self.idle_listeners: list[Callable[[], bool | None]] = []
        # by record kind: what the writer thread does to a record before writing it (the hooks leave
        # it what need not run on the training thread: comms' module matching)
        self.resolvers: dict[str, Callable[[tuple[Any, ...]], tuple[Any, ...]]] = {}
        self._idle_lock = threading.Lock()  # no patching while stop() undoes
        self.engine: Any = None  # the DeepSpeed engine once seen
        self.state = CollectorState()  # what collectors keep for each other (module tracker, ...)
        self._header_rank: int | None = None
        self._rank_known = False  # header lacked the rank (agent started before the process group)
        self._layout_known = False  # Megatron's parallel state is initialized after the agent starts
        self._layout_modules = -1  # len(sys.modules) when a check found no Megatron to ask (skip it)
        # bookkeeping
        self.errors: dict[ErrorKey, int] = {}
        self.error_messages: list[tuple[str, str, str, str]] = []  # (*key, first message)
        self.captured: dict[str, int] = {}
        self.installed: list[str] = []
        self.install_failures: dict[str, str] = {}
        self.undo = Undo()
        self._wall0 = time.time_ns()
        self._perf0 = time.perf_counter_ns()
        self._stop = threading.Event()
        self._flush_now = Wakeup()
        self._thread: threading.Thread | None = None
        self._file: TraceFileWriter | None = None
        self._lock = threading.Lock()
        self._errors_written: dict[ErrorKey, int] = {}
        self._error_count = 0  # errors recorded so far (the writer formats them when it grows)
        self._errors_done = 0  # ... and when it last did
        self._idle_modules = -1  # len(sys.modules) when every idle listener last said it was settled
        self._unsettled = 0  # `unsettle()` calls: one that lands while the listeners run is kept
        self._last_stats = 0.0
        self._sched = SchedReader()  # the training thread's CPU and run-queue wait, each flush
        # the agent's own cost: writer-thread CPU always; hook time with the `self_time` option
        self.writer_cpu_ns = 0
        self.self_time = options.self_time
        self.hook_ns = 0
        self.hook_calls = 0
        self.hook_by: dict[str, list[int]] = {}  # collector -> [ns, calls] (self_time): what is fixed
        # per step (steps, overflow, memory) apart from what grows with the collectives (comms)
        self.probe_ns = 0.0  # what timing one hook adds to its own figure (calibrated at start)
        self._in_hook = threading.local()
        self._held: list[tuple[float, tuple[Any, ...]]] = []  # records waiting on GPU timings
        self._entered = _pending.Entered()  # held collectives announced as entered, not completed

    # ---- hot-path helpers -------------------------------------------------------------------
    def now(self) -> int:
        return time.perf_counter_ns()

    def guard(self, collector: str, fn: Callable[..., Any], where: str | None = None) -> Callable[..., Any]:
        """Wrap a hook so that nothing it raises reaches the job: the error is counted instead. An
        injected fault (the `faults` option, fixed at start) is looked up here, not on each call.
        With `self_time` the same one frame also adds the hook's CPU time (this thread's: a rank
        preempted inside a hook on a busy host costs the job nothing) to `hook_ns`, once per
        outermost hook (a hook run from inside another, a step listener from the steps hook, is in
        its caller's time): a timing wrapper around the guard cost a frame the job never pays, where
        hooks run cold. Measures diag's own Python, not the job's: every guarded function runs
        between the job's calls. The timing's own share is calibrated at start (`own_hook_ns`)."""
        label: str = where or str(getattr(fn, "__name__", "hook"))
        agent, local, clock, timing = self, self._in_hook, time.thread_time_ns, self.self_time
        action = self.faults.get(collector)
        mine = self.hook_by.setdefault(collector, [0, 0]) if timing else [0, 0]

        def guarded(*args: Any, **kwargs: Any) -> Any:
            outer = timing and not getattr(local, "on", False)
            if outer:
                local.on = True
                t0 = clock()
            try:
                if action:
                    _faults.trigger(action)
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the whole point
                agent.record_error(collector, label, exc)
                return None
            finally:
                if outer:
                    spent = clock() - t0
                    agent.hook_ns += spent
                    agent.hook_calls += 1
                    mine[0] += spent
                    mine[1] += 1
                    local.on = False

        guarded.__wrapped__ = fn  # type: ignore[attr-defined]
        return guarded

    def _calibrate(self, n: int = 5000) -> None:
        """The timing's own share of a timed hook (clock reads, the wrappers): the least of a few
        batches of a no-op hook, subtracted per call in `own_hook_ns` (~0.4 us a hook here, against
        ~5 us for a collective's whole bookkeeping)."""
        noop = self.guard("agent", _noop, "calibrate")
        best = None
        for _ in range(5):
            ns0 = self.hook_ns
            for _ in range(n):
                noop()
            per = (self.hook_ns - ns0) / n
            best = per if best is None else min(best, per)
        self.hook_ns = self.hook_calls = 0
        self.hook_by.pop("agent", None)
        self.probe_ns = best or 0.0

    def own_hook_ns(self) -> int | None:
        """CPU time in diag's hooks so far, less the timing's own share (None without self_time)."""
        if not self.self_time:
            return None
        return max(0, int(self.hook_ns - self.hook_calls * self.probe_ns))

    def own_hook_ns_by(self) -> dict[str, int] | None:
        """`own_hook_ns` by collector (the outermost hook's: a step listener is in `steps`)."""
        if not self.self_time:
            return None
        return {name: max(0, int(ns - calls * self.probe_ns)) for name, (ns, calls) in self.hook_by.items()}

    def record_error(self, collector: str, where: str, exc: BaseException) -> None:
        key = (collector, where, type(exc).__name__)
        self._error_count += 1
        n = self.errors.get(key, 0) + 1
        self.errors[key] = n
        if n == 1 and len(self.error_messages) < MAX_ERROR_MESSAGES:
            tb = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self.error_messages.append((collector, where, type(exc).__name__, tb[:500]))

    def begin_step(self, step: int) -> None:
        """Called by the steps collector at each optimizer-step boundary (training thread)."""
        self.step = step
        every = self.layers_every
        if self._to_steady:
            # a job past its first steps when the agent saw its first boundary (started in-process
            # mid-run: bench.overhead's blocks at step 1000, or resumed from a checkpoint) has its
            # steady steps sampled every `layers_every`: its warm-up is not in this trace
            fresh = step <= FRESH_STEPS
            self._to_steady = self._to_steady - 1 if fresh else 0
            self.sampled = every > 0 and (step % every == 0 or (fresh and not self._to_steady))
        else:
            self.sampled = every > 0 and step % every == 0
        if not (self._layout_known and self._rank_known) and len(sys.modules) != self._layout_modules:
            self._learn_layout()
        faults = self.faults
        for collector, where, fn in self.step_listeners:  # inline, each guarded here (StepListener)
            try:
                if faults and collector in faults:
                    _faults.trigger(faults[collector])
                fn(step)
            except Exception as exc:  # noqa: BLE001 - counted, never raised into the job
                self.record_error(collector, where, exc)

    def _learn_layout(self) -> None:
        """Write rank / world and Megatron's TP/PP/DP as meta once they exist (checked per step
        until then: a dict lookup in sys.modules and one call)."""
        try:
            if not self._rank_known:
                rank, world = rank_and_world()
                if rank is not None:
                    self._rank_known = True
                    if rank != self._header_rank:
                        self.set_meta("rank", rank)
                        self.set_meta("world_size", world)
            if not self._layout_known:
                layout = megatron_layout()
                if layout:
                    self._layout_known = True
                    for key, value in layout.items():
                        self.set_meta(key, value)
                elif self._rank_known and MEGATRON_STATE not in sys.modules:
                    self._layout_modules = len(sys.modules)  # nothing to ask until an import
        except Exception as exc:  # noqa: BLE001
            self._layout_known = self._rank_known = True  # don't retry a broken parallel state
            self.record_error("agent", "layout", exc)

    def _learn_versions(self, missing: dict[str, str]) -> bool:
        """The framework versions imported since the header (at start, then an idle listener on the
        writer thread). Guarded here, not by `guard`: it is no hook of the job's (no self-time)."""
        try:
            for key, version in late_versions(missing).items():
                self.set_meta(key, version)
        except Exception as exc:  # noqa: BLE001 - counted, never raised into the job
            self.record_error("agent", "versions", exc)
        return True

    def set_meta(self, key: str, value: Any) -> None:
        self.emit((schema.META, self.now(), key, value))

    def saw_engine(self, engine: Any) -> None:
        """Record the DeepSpeed engine's layout and effective config once it exists."""
        if self.engine is engine:
            return
        self.engine = engine
        for key, value in describe_job(engine).items():
            self.set_meta(key, value)

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        _fork.watch(self)  # forked children (DataLoader workers) start without this agent
        _uncaught.install(self)  # an exception that ends the job is in its trace (undone at stop)
        rank, _ = rank_and_world()
        self._file = TraceFileWriter(self.trace_dir, rank_file_name(rank, os.getpid()))
        new_file()  # its first call of each group carries the group's ranks
        header = build_header(
            self._wall0,
            self._perf0,
            {
                "what": list(self.what),
                "layers_every": self.layers_every,
                "ring_capacity": self.ring.capacity,
            },
        )
        self._file.write_objects([header])
        self._header_rank = header.get("rank")
        self._rank_known = self._header_rank is not None
        self._layout_known = bool(header.get("tp"))
        if self.self_time:
            self._calibrate()
        self._thread = threading.Thread(target=self._run, name="diag-writer", daemon=True)
        self._thread.start()  # before the installs: on attach, events flow while `layers` warms up
        # memory's step listener before steps' first boundary (an attach lands mid-run: each step
        # record has its memory record); steps before comms (a collective carries the job's step
        # number); layers' 1-3 s install last
        for name in sorted(self.what, key=lambda n: (n == "layers", n != "memory")):
            self._install(name)
        # versions the header lacks, as meta once imported (the reader merges meta into the header):
        # what the installs imported (torch) at once, before the writer's next flush; the rest later
        missing = {key: mod for key, mod in VERSIONS.items() if header.get(key) is None}
        self._learn_versions(missing)
        if missing:
            self.idle_listeners.append(lambda: self._learn_versions(missing))
        # the control socket is started by diag.agent.start() once this agent is the current one:
        # a `detach` that arrives at once must find it there (else it stops a half-started agent)

    def _start_control(self, detach: Callable[[], list[str]]) -> None:
        """The control socket for `diag status/detach` (attach and `diag run` ask for it); `detach`
        is diag.agent's way to stop this agent (the server does not import diag.agent)."""
        try:
            from diag.control.server import ControlServer

            server = ControlServer(self, detach, lambda: rank_and_world()[0])
            self.undo.call(server.stop, "control-server")  # before it can serve a detach
            server.start()
        except Exception as exc:  # noqa: BLE001 - tracing goes on without the socket
            self.record_error("control", "start", exc)

    def _install(self, name: str) -> None:
        try:
            install: Installer = importlib.import_module(COLLECTORS[name]).install
            install(self, self.undo)
            self.installed.append(name)
        except Exception as exc:  # noqa: BLE001 - one broken collector must not stop the others
            self.install_failures[name] = f"{type(exc).__name__}: {exc}"
            self.record_error(name, "install", exc)

    def stop(self) -> list[str]:
        """Remove every hook and wrapper, flush, close. Returns undo actions that failed."""
        with self._idle_lock:
            self.idle_listeners.clear()
            failed = self.undo.run()
        self.step_listeners.clear()
        self.installed.clear()
        self._stop.set()
        self._flush_now.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._flush(final=True)
        self._sched.close()
        if self._file is not None:
            self._file.close()
        return failed

    def write_now(self) -> None:
        """Write what is buffered from this thread, now (the job is ending: `diag.agent.uncaught`)."""
        try:
            self._flush(final=False)
        except Exception as exc:  # noqa: BLE001
            self.record_error("agent", "write_now", exc)

    def flush(self) -> None:
        """Ask the writer thread to write what is buffered now (snapshot)."""
        self._flush_now.set()

    # ---- writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        name_this_thread()
        if self.self_time:
            self._in_hook.on = True  # hooks run here (idle listeners) are in writer_cpu_ns already
        every = FLUSH_INTERVAL_S
        now = time.time()
        due, wake = self._next_wake((now // every + 1) * every, now)
        while not self._stop.is_set():
            asked = self._flush_now.wait(max(0.0, wake - time.time()))
            c0 = time.thread_time_ns()
            now = time.time()
            if asked or now >= due - 0.001:  # a timed wait may end a hair early
                due = ((now + 0.001) // every + 1) * every
                try:
                    self._flush(final=False)
                except Exception as exc:  # noqa: BLE001 - keep the thread alive, count it
                    self.record_error("agent", "writer", exc)
            if self.idle_listeners and len(sys.modules) != self._idle_modules:
                self._run_idle_listeners()
            due, wake = self._next_wake(due, time.time())
            self.writer_cpu_ns += time.thread_time_ns() - c0

    def _next_wake(self, due: float, now: float) -> tuple[float, float]:
        """(the next flush tick, when to wake): the tick, or the next LISTEN_INTERVAL_S tick before
        it while an idle listener waits for an import. A tick more than an interval away (the wall
        clock was set back) is the next one from now; one passed (a listener ran past it) is due."""
        every = FLUSH_INTERVAL_S
        if due > now + every:
            due = (now // every + 1) * every
        if self.idle_listeners and len(sys.modules) != self._idle_modules:
            return due, min(due, (now // LISTEN_INTERVAL_S + 1) * LISTEN_INTERVAL_S)
        return due, due

    def unsettle(self) -> None:
        """Run the idle listeners at the next flush although nothing was imported: one of them has
        new work (a bare process group to name, `collectors.comms.groups`)."""
        self._unsettled += 1
        self._idle_modules = -1

    def _run_idle_listeners(self) -> None:
        """Each flush, while something was imported since every listener last said it was settled
        (returned True: a framework it waits for is patched or absent, none half-imported)."""
        count = len(sys.modules)
        if not self.idle_listeners or count == self._idle_modules:
            return
        asked = self._unsettled
        with self._idle_lock:
            settled = [listener() for listener in list(self.idle_listeners)]  # each guarded
        if all(done is True for done in settled) and asked == self._unsettled:
            self._idle_modules = count

    def _flush(self, final: bool) -> None:
        now = time.monotonic()
        stats_due = final or now - self._last_stats >= STATS_INTERVAL_S
        if not (stats_due or self.ring.queue or self._held or self._error_count != self._errors_done):
            return  # an idle flush: nothing to write (most flushes between a long step's records)
        with self._lock:
            if self._file is None:
                return
            lines = self._lines(self.ring.drain(), final)
            if self._error_count != self._errors_done:
                self._errors_done = self._error_count
                lines.extend(dumps(o) for o in self._new_errors())
            if stats_due:
                self._last_stats = now
                lines.append(dumps(schema.to_json(self._stats_record(), self._wall0, self._perf0)))
            if lines:
                sched = self._sched.record(time.perf_counter_ns())
                if sched is not None:
                    line = flat_text(sched, self._wall0 - self._perf0)  # ints only: never None
                    lines.append(line if line is not None else _line(sched, self._wall0, self._perf0))
                self._file.write_lines(lines)

    def _lines(self, recs: list[tuple[Any, ...]], final: bool) -> list[str]:
        """The lines of the records written now, counted by kind in `captured`: those held from
        earlier flushes first (settled now, given up or held again), then this flush's in order, each
        completed by its kind's resolver first (`resolvers`: in record order, as comms' matching
        needs), then a `comm_open` for each held collective newly past `pending.OPEN_S`. A record
        whose GPU timing is not known yet is held back (`diag.agent.pending`); nearly all are settled
        at once (a CPU duration is known by the flush) and take one pass: a collective's duration is
        looked at in its declared spot and handed to `comm_text` as it is (the record is not
        rebuilt), another record whose fields are all plain values has a `flat_text` line and
        nothing to settle. One loop over the records: the flushes run cold (the job's compute
        between two evicts the writer's code and data), so each pass and call per record costs."""
        lines: list[str] = []
        held = self._held
        if not recs and not held:
            return lines
        now = time.monotonic()
        if held:
            self._held = []
            out: list[tuple[Any, ...]] = []
            for since, rec in held:
                self._place(since, rec, _pending.settle(rec), now, final, out)
            self._add(out, lines)
        captured, shift, resolvers = self.captured, self._wall0 - self._perf0, self.resolvers
        fast = _pending.spot(_COMM, COMM_FIELDS) == DUR_AT  # where the comms collector declared it
        # `pending.poll_spot` inline (a call a collective less): a Pending type's poll, a plain value
        # as it is, a type not looked at yet the general way
        pending_types, plain_types = _pending.PENDING_TYPES, _pending.PLAIN_TYPES
        not_ready = _pending.NOT_READY
        for rec in recs:
            if resolvers:
                resolve = resolvers.get(rec[0])
                if resolve is not None:
                    try:
                        rec = resolve(rec)
                    except Exception as exc:  # noqa: BLE001 - one lost record, counted
                        self.record_error("agent", f"resolve:{rec[0]}", exc)
                        continue
            kind = rec[0]
            if kind is _COMM and fast and len(rec) == COMM_FIELDS:
                dur = rec[DUR_AT]
                if type(dur) in pending_types:
                    dur = dur.poll()
                    if dur is not_ready:
                        self._settle(rec, now, final, lines)
                        continue
                elif type(dur) not in plain_types:
                    self._settle(rec, now, final, lines)
                    continue
                captured[kind] = captured.get(kind, 0) + 1
                try:
                    line = comm_text(rec, dur, shift)
                    if line is None:  # a field not of the agent's types: the general way
                        line = _line((*rec[:DUR_AT], dur, *rec[DUR_AT + 1 :]), self._wall0, self._perf0)
                except Exception as exc:  # noqa: BLE001 - a malformed record is one lost record
                    self.record_error("agent", f"format:{kind}", exc)
                    continue
                lines.append(line)
                continue
            line = flat_text(rec, shift)
            if line is None:  # a dict, a Pending, a NaN, ...: the general way
                self._settle(rec, now, final, lines)
                continue
            captured[kind] = captured.get(kind, 0) + 1
            lines.append(line)
        if self._held:
            self._add(self._entered.announce(self._held, now), lines)
        return lines

    def _settle(self, rec: tuple[Any, ...], now: float, final: bool, lines: list[str]) -> None:
        """The general way for one of this flush's records: settled and written, or held."""
        out: list[tuple[Any, ...]] = []
        self._place(now, rec, _pending.settle(rec), now, final, out)
        self._add(out, lines)

    def _add(self, recs: list[tuple[Any, ...]], lines: list[str]) -> None:
        """Count and write settled records through `_line` (a malformed one is one lost record)."""
        captured, wall0, perf0 = self.captured, self._wall0, self._perf0
        for rec in recs:
            kind = rec[0]
            captured[kind] = captured.get(kind, 0) + 1
            try:
                lines.append(_line(rec, wall0, perf0))
            except Exception as exc:  # noqa: BLE001 - a malformed record is one lost record
                self.record_error("agent", f"format:{kind}", exc)

    def _place(
        self,
        since: float,
        rec: tuple[Any, ...],
        done: tuple[Any, ...] | None,
        now: float,
        final: bool,
        out: list[tuple[Any, ...]],
    ) -> None:
        """A record held since `since` (`done`: settled now): written, given up, or held again."""
        if done is not None:
            out.append(done)
        elif final:  # stopping (detach): in flight, not failed; the job completes it unseen
            out.append(_pending.resolve(rec, give_up=True))
        elif now - since > _pending.MAX_HOLD_S:
            self.record_error("agent", "pending-timeout", TimeoutError("op never completed"))
            out.append(_pending.resolve(rec, give_up=True))
        else:
            self._held.append((since, rec))

    def _new_errors(self) -> list[dict[str, Any]]:
        out = []
        messages = {(c, w, e): m for c, w, e, m in self.error_messages}
        for key, count in list(self.errors.items()):
            if self._errors_written.get(key) != count:
                self._errors_written[key] = count
                out.append(
                    schema.to_json(
                        (schema.ERROR, self.now(), *key, messages.get(key, ""), count),
                        self._wall0,
                        self._perf0,
                    )
                )
        return out

    def _stats_record(self) -> tuple[Any, ...]:
        errors: dict[str, int] = {}
        for (collector, _, _), n in self.errors.items():
            errors[collector] = errors.get(collector, 0) + n
        return (
            schema.STATS,
            self.now(),
            dict(self.captured),
            dict(self.ring.dropped),
            errors,
            self.ring.capacity,
            self.ring.high_water,
        )

    def status(self) -> dict[str, Any]:
        """What `diag status` shows: collectors, captured/dropped/failed counts, file health."""
        stats = self._stats_record()
        return {
            "pid": os.getpid(),
            "trace_file": self._file.path if self._file else None,
            "collectors": list(self.installed),
            "install_failures": dict(self.install_failures),
            "step": self.step,
            "layers_every": self.layers_every,
            "captured": _by_collector(stats[2]),
            "dropped": _by_collector(stats[3]),
            "errors": stats[4],
            "error_messages": [list(m) for m in self.error_messages],
            "buffered": len(self.ring),
            "lines_lost": self._file.lines_lost if self._file else 0,
            "write_error": self._file.last_error if self._file else None,
            "writer_cpu_ns": self.writer_cpu_ns,
            "hook_ns": self.own_hook_ns(),
            "hook_calls": self.hook_calls,
            "hook_ns_by": self.own_hook_ns_by(),
        }


def _line(rec: tuple[Any, ...], wall0: int, perf0: int) -> str:
    """A settled record's line: a collective (most records) and a flat record straight from the
    tuple, the rest (a dict or a NaN in a field) through a dict and the encoder."""
    if rec[0] == _COMM:
        line = comm_line(rec, wall0, perf0)
    else:
        line = flat_text(rec, wall0 - perf0)
    return line if line is not None else dumps(schema.to_json(rec, wall0, perf0))


_COLLECTOR_OF_KIND = {schema.COMM: "comms", schema.LAYER: "layers", schema.STEP: "steps"}


def _by_collector(counts: dict[str, int]) -> dict[str, int]:
    """Event-kind counts keyed like `collectors` and `errors` (`comm` -> `comms`): one row each."""
    out: dict[str, int] = {}
    for kind, n in counts.items():
        key = _COLLECTOR_OF_KIND.get(kind, kind)
        out[key] = out.get(key, 0) + n
    return out


def _noop() -> None:
    """The calibration hook: nothing to do, so all it measures is the measuring."""
