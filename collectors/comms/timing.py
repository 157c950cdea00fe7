"""When a collective ends: a duration set by its completion, never by waiting for it.

A c10d call only enqueues the work (gloo runs it on its own threads, NCCL on its stream), so the
wall clock around the call says nothing. The record is emitted at issue with a `Later` duration that
the completion fills in, by the cheapest signal that is exact for the kind of call:
- blocking calls (the caller's async_op=False) timed by the wall clock: torch itself calls
  `Work.wait()` right after the call, so the comms wrapper waits for the Work itself before it
  returns and reads the clock there (torch's own wait then returns at once). The end is the same
  moment; what it saves is a Python `Work.wait` wrapper run on every wait (~5-10 us a collective
  where hooks run cold);
- blocking calls on a GPU: a class-level `Work.wait` wrapper records the end event after torch's
  wait (the stream waits for the collective there);
- async calls: the Work's future callback, on gloo's thread when it finishes, or for NCCL on a
  stream that waits for the collective (where the end CUDA event is recorded);
- send/recv (gloo's p2p Work has no future; `send` and `isend` look alike here): the first wait.
The `Work.wait` wrapper is installed at the first call that needs it (a p2p op, a blocking GPU call,
a Work without a future): a job of CPU collectives never has one.
A future callback is Python: gloo's thread takes the GIL to run it. A process group whose last
reference goes (DDP's Reducer freed when the job's `main()` returns) joins gloo's threads in its
destructor while the freeing thread holds the GIL: with a callback still waiting for the GIL, both
wait forever. The public DDP tutorial hung so at exit (rank 0 in `~ProcessGroupGloo` <- `~Reducer`,
gloo's thread in `gil_scoped_acquire` for diag's callback), 2 runs in 4 after a rank was stopped
and resumed. So each pending callback holds its group (`held`); the callback hands it to the writer
thread (`released`, dropped by `drop_released`) once it ran; a stop first lets pending callbacks
run (GIL released, at most `DRAIN_S`).
The writer thread holds the record until the duration is known (`diag.agent.pending`). Works are
referenced weakly or until the next wait, so one never waited does not leak: its record is written
with a null duration. At detach (or any stop) the ops still in flight are not errors: the job goes on
and completes them unseen. Their records are written with a null duration and counted in one
`unfinished_at_detach` meta record (written at every stop, 0 when none), which also tells readers
that the rank's trace ended while the job ran on (analyzers/hang_desync.py reads it); a CUDA span
not yet complete at stop is still given up by the writer. GPU time comes from the device seam's
CUDA-event timer (collectors/device/, which tests swap for a fake device); the host never synchronizes.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from diag.collectors.device import CpuTimer, Timer, make_timer

from diag import schema
from diag.agent.api import AgentAPI
from diag.agent.pending import NOT_READY, Pending
from diag.agent.undo import Undo

UNFINISHED_AT_DETACH = schema.META_UNFINISHED_AT_DETACH
# what a call not on a GPU hands its recorder instead of a `before` state: it is timed by the wall
# clock from the t0 read before the call, and everything else is read after it (one hook, not two)
CPU_CALL: Any = ("cpu",)
DRAIN_S = 1.0  # a stop waits this long at most for pending future callbacks (normally none, or ms)


class Later(Pending):
    """A duration in ns (or a CUDA-event span) that `finish()` sets when the work completes."""

    __slots__ = ("dur", "timer", "token")

    def __init__(self, timer: Timer, token: Any) -> None:
        self.timer = timer
        self.token = token
        self.dur: Any = None

    def finish(self, end: int | None = None) -> None:
        """`end`: the wall clock read as the wait returned (before diag's own hook ran), if known."""
        if self.dur is None:
            timer = self.timer  # the wall clock's stop read here: one call fewer a collective
            if type(timer) is CpuTimer:
                self.dur = (end or time.perf_counter_ns()) - self.token
            else:
                self.dur = timer.stop(self.token)

    def ready(self) -> bool:
        d = self.dur
        return d is not None and (type(d) is int or d.ready())

    def value(self) -> Any:
        d = self.dur
        return d if type(d) is int else d.value()

    def poll(self) -> Any:
        d = self.dur
        return d if type(d) is int else NOT_READY if d is None else d.poll()


class _Unfinished(Pending):
    """The duration of an op still in flight when diag stopped: known to be unknown (null)."""

    __slots__ = ()

    def ready(self) -> bool:
        return True

    def value(self) -> Any:
        return None


UNFINISHED = _Unfinished()


def _on_cuda(tensor: Any) -> bool:
    return bool(tensor.is_cuda)


class CommTiming:
    """Starts a `Later` per call and ties it to the call's Work. `is_gpu` is a seam for tests (CPU
    tensors taken for CUDA ones; their events come from a fake device behind the device seam)."""

    def __init__(self, agent: AgentAPI, is_gpu: Callable[[Any], bool] | None = None) -> None:
        self.agent = agent
        self.cpu = CpuTimer()
        self.gpu_timer: Timer | None = None  # made at the first CUDA call
        self.is_gpu = is_gpu or _on_cuda
        self.waiting: weakref.WeakKeyDictionary[Any, Later] = weakref.WeakKeyDictionary()
        self.last: Any = None  # the blocking call's Work, until the wait torch makes next
        self.last_later: Later | None = None
        self.inflight: set[Later] = set()  # async calls finished by their future's callback
        self.blocked: set[Later] = set()  # blocking calls the comms wrapper is waiting for now
        self.held: dict[Later, Any] = {}  # each pending callback's process group, kept alive
        self.released: list[Any] = []  # groups whose callback ran: dropped by the writer thread
        self._finish = agent.guard("comms", self._finished, "complete")
        self._waited = agent.guard("comms", self._on_wait, "wait")
        self._undo: Undo | None = None
        self._wait_lock = threading.Lock()  # the training thread patches `Work.wait`; a stop undoes
        self.wait_hooked = False  # `Work.wait` is wrapped (at the first call that needs it)
        self.stopped = False
        cuda = sys.modules.get("torch.cuda")
        # could a call's tensors be on a GPU? Not before the job initialized CUDA: making a CUDA
        # tensor initializes it (torch.cuda's own flag, as the device seam's `ready()` reads it)
        self.may_be_gpu: Callable[[], bool] = (
            (lambda: bool(getattr(cuda, "_initialized", True)))
            if is_gpu is None and cuda is not None
            else (lambda: True)
        )

    def start(self, tensor: Any, t0: int) -> Later:
        """Before the call: a wall-clock start (t0), or a CUDA event on the current stream."""
        if tensor is not None and self.is_gpu(tensor):
            timer = self.gpu_timer
            if timer is None:
                timer = self.gpu_timer = make_timer("cuda")
            return Later(timer, timer.start())
        return Later(self.cpu, t0)

    def bind(self, work: Any, later: Later, p2p: bool, async_op: bool | None, pg: Any = None) -> None:
        """After the call: finish `later` when `work` completes (now, if the call was blocking);
        `pg`, the call's process group, is held until a future callback has run (module doc)."""
        if work is None:  # monitored_barrier and other blocking calls return no Work
            later.finish()
        elif p2p:
            self.hook_wait()
            self.waiting[work] = later
        elif async_op is False:
            self.hook_wait()
            if self.last is not None and self.last_later is not None:  # another thread's blocking
                # call, not waited yet (the two are set together)
                self.waiting[self.last] = self.last_later
            self.last, self.last_later = work, later
        else:
            try:
                future = work.get_future()
            except RuntimeError:  # "getFuture not implemented" (a third-party backend's work)
                self.hook_wait()
                self.waiting[work] = later
                return
            self.inflight.add(later)
            if pg is not None:
                self.held[later] = pg
            future.then(functools.partial(self._finish, later))

    def _finished(self, later: Later, _future: Any = None) -> None:
        later.finish()
        self.inflight.discard(later)
        pg = self.held.pop(later, None)
        if pg is not None:  # never dropped here: the last reference would join this very thread
            self.released.append(pg)
            self.agent.unsettle()  # the writer's idle listeners run at its next flush

    def drop_released(self) -> bool:
        """Writer thread: drop the groups whose callbacks ran (a group still referenced by another
        pending callback stays alive through that one's own reference). Always settled."""
        while self.released:
            self.released.pop()
        return True

    def _on_wait(self, work: Any, end: int) -> None:
        if work is self.last:
            later = self.last_later
            self.last = self.last_later = None
        else:
            later = self.waiting.pop(work, None)
        if later is not None:
            later.finish(end)

    def _forget(self) -> None:
        """Stop: every op still in flight gets a null duration (not an error) and is counted. The
        future callbacks already waiting for the GIL run first (at most `DRAIN_S`): once stopped, a
        group dropped by the job must not be freed with one of them still waiting (module doc)."""
        with self._wait_lock:
            self.stopped = True  # no `Work.wait` wrapper after this: nothing would undo it
        deadline = time.monotonic() + DRAIN_S
        while self.held and time.monotonic() < deadline:
            time.sleep(0.005)  # the GIL released: gloo's threads run the callbacks they hold
        self.drop_released()  # the groups still held stay alive: their callbacks never ran
        pending = [*self.inflight, *self.waiting.values(), *self.blocked, self.last_later]
        self.waiting.clear()
        self.inflight.clear()
        self.last = self.last_later = None
        unfinished = 0
        for later in pending:
            if later is not None and later.dur is None:
                later.dur = UNFINISHED
                unfinished += 1
        self.agent.set_meta(UNFINISHED_AT_DETACH, unfinished)

    def install(self, undo: Undo) -> None:
        """Ready to wrap `Work.wait` when a call needs it (`hook_wait`); at stop, the ops in flight
        are counted (`_forget`)."""
        self._undo = undo
        undo.call(self._forget, "comms: pending works")
        self.agent.idle_listeners.append(self.agent.guard("comms", self.drop_released, "drop-groups"))

    def hook_wait(self) -> None:
        """Wrap `Work.wait` (class-level) to see completions, once; costs one test for other works."""
        if self.wait_hooked:
            return
        with self._wait_lock:
            if self.wait_hooked or self.stopped or self._undo is None:
                return
            from torch._C._distributed_c10d import Work

            original = Work.wait
            waited, now = self._waited, time.perf_counter_ns

            def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(work, *args, **kwargs)
                if work is self.last or self.waiting:
                    waited(work, now())  # the end as the wait returned, not after diag's hook began
                return result

            self._undo.patch(Work, "wait", wait)
            self.wait_hooked = True
