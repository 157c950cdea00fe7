"""The comms collector in this process (a one-rank gloo group): the CUDA-event path through the
timing seam with fake events, faults, module and step attribution, leaks, and undo."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref

import pytest
import torch
import torch.distributed as dist
from diag.collectors import comms
from diag.collectors.comms.timing import CommTiming, Later
from torch._C._distributed_c10d import Work
from torch.distributed import ProcessGroup

from diag import agent, schema
from diag.agent import pending
from tests.unit.fake_device import FakeDevice, installed


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory):
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


class FakeEvent:
    """Stands in for torch.cuda.Event: completes when the test says so; synchronizing is a bug."""

    done = False
    clock_ms = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None

    def record(self, stream=None) -> None:
        FakeEvent.clock_ms += 1.5
        self.at = FakeEvent.clock_ms

    def query(self) -> bool:
        return FakeEvent.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert FakeEvent.done and self.at is not None and end.at is not None
        return end.at - self.at

    def synchronize(self) -> None:
        raise AssertionError("diag must never synchronize the device")


def _comm_lines(path: str) -> list[dict]:
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["k"] == schema.COMM]


def test_cuda_path_records_events_and_waits_for_them(group, tmp_path) -> None:
    ag = agent.start(str(tmp_path), what=("steps",))
    timing = CommTiming(ag, is_gpu=lambda t: True)
    comms.install(ag, ag.undo, timing=timing)
    FakeEvent.done = False
    t = torch.ones(8)
    with installed(FakeDevice(FakeEvent)):  # the device seam's events, on the CPU tensors
        dist.all_reduce(t)  # blocking: ended by the wait torch makes
        dist.all_reduce(t, async_op=True).wait()  # async: ended by the Work's future callback
    ag._flush(final=False)
    path = ag.status()["trace_file"]
    assert _comm_lines(path) == [], "written before its end event completed"
    FakeEvent.done = True
    agent.stop()
    recs = _comm_lines(path)
    assert [(r["op"], r["bytes"], r["async_op"]) for r in recs] == [
        ("all_reduce", 32, False),
        ("all_reduce", 32, True),
    ]
    assert [r["dur"] for r in recs] == [1_500_000] * 2  # start/end events 1.5 ms apart (fake clock)
    assert torch.equal(t, torch.ones(8))


def test_faults_leave_collectives_working_and_are_counted(group, tmp_path) -> None:
    ag = agent.start(str(tmp_path), what=("comms",), faults={"comms": "raise"})
    t = torch.full((4,), 3.0)
    for _ in range(5):
        dist.all_reduce(t)
    work = dist.all_gather_into_tensor(torch.zeros(4), t, async_op=True)
    work.wait()
    # the collector's idle listeners (naming new groups, dropping held ones) raise too whenever the
    # writer thread runs them: after an import, at a flush, so only on a slow host within this test
    # (failed once at load 6)
    calls = {k: n for k, n in ag.errors.items() if k[1] not in ("groups-recheck", "drop-groups")}
    assert calls == {
        ("comms", "allreduce", "InjectedFault"): 5,
        ("comms", "all_gather_single", "InjectedFault"): 1,
    }
    path = ag.status()["trace_file"]
    agent.stop()
    assert torch.equal(t, torch.full((4,), 3.0))
    assert _comm_lines(path) == []


class _Reduce(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.sync = _Reduce()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sync(self.lin(x))


def test_module_and_step_attribution(group, tmp_path) -> None:
    net = _Net()
    ag = agent.start(str(tmp_path), what=("comms",))
    ag.begin_step(7)
    net(torch.ones(2, 4))
    dist.barrier()
    path = ag.status()["trace_file"]
    agent.stop()
    recs = _comm_lines(path)
    assert [(r["op"], r["step"]) for r in recs] == [("all_reduce", 7), ("barrier", 7)]
    assert recs[0]["module"] == "sync" and recs[1]["module"] is None


def test_modules_tracked_on_some_steps_and_matched_on_the_others(group, tmp_path) -> None:
    """attribute_every=10: the job's first 10 steps and every 10th track the module; the others
    (module hooks off) take their match's in the last tracked step, the same op, bytes and group
    (issue 9: only 1 step in 10 was attributed); a collective with no match keeps None, and the
    step after it is tracked (22; at most one such step in 10: not 24). A collective issued outside
    any module (an optimizer's) matches its tracked twin's None: no step is tracked for it (46).
    The writer thread matches at its flush (each 0.2 s in a job): flushed after each step here."""
    net = _Net()
    ag = agent.start(str(tmp_path), what=("comms",), attribute_every=10)
    steps = ((9, 2), (17, 2), (20, 2), (21, 3), (22, 2), (23, 5), (24, 5), (30, 5), (45, 5), (46, 5))
    for step, rows in steps:
        ag.begin_step(step)
        net(torch.ones(rows, 4))
        dist.all_reduce(torch.ones(1))
        ag.write_now()
    path = ag.status()["trace_file"]
    agent.stop()
    recs = _comm_lines(path)
    modules = [r["module"] for r in recs if r["op"] == "all_reduce" and r["bytes"] > 4]
    assert list(zip([s for s, _ in steps], modules)) == [
        (9, "sync"),
        (17, "sync"),
        (20, "sync"),
        (21, None),
        (22, "sync"),
        (23, None),
        (24, None),
        (30, "sync"),
        (45, "sync"),
        (46, "sync"),
    ]
    assert [r["module"] for r in recs if r["bytes"] == 4] == [None] * len(steps)
    with open(path) as f:
        meta = [r for r in map(json.loads, f) if r["k"] == schema.META]
    assert [m["value"] for m in meta if m.get("key") == "attribute_every"] == [10]
    # step 0: the install's step (before any boundary every step is attributed)
    assert [m["value"] for m in meta if m.get("key") == "attributed_step"] == [0, 9, 20, 22, 30]


def test_unwaited_work_does_not_leak(group, tmp_path) -> None:
    ag = agent.start(str(tmp_path), what=("steps",))
    timing = CommTiming(ag)
    work, later = Work(), Later(timing.cpu, 0)
    timing.bind(work, later, p2p=True, async_op=None)
    assert len(timing.waiting) == 1
    del work
    gc.collect()
    assert len(timing.waiting) == 0 and not later.ready()
    agent.stop()


def test_stop_restores_process_group_and_work(group, tmp_path) -> None:
    methods = dict(ProcessGroup.__dict__)
    allreduce, wait = ProcessGroup.allreduce, Work.wait
    ag = agent.start(str(tmp_path), what=("comms",))
    assert ProcessGroup.allreduce is not allreduce
    dist.all_reduce(torch.ones(4))  # blocking, on CPU: the comms wrapper waits, no Work.wait wrapper
    assert Work.wait is wait
    timing = ag.state.get(CommTiming)
    assert timing is not None
    timing.hook_wait()  # what a p2p op or a blocking GPU call does first
    assert Work.wait is not wait
    agent.stop()
    assert ProcessGroup.allreduce is allreduce and Work.wait is wait
    assert {n for n, v in methods.items() if ProcessGroup.__dict__.get(n) is not v} == set()


def test_profiler_sees_each_collective_once_on_a_sampled_step(group, tmp_path) -> None:
    """On a sampled step the layers collector's FlopMode is pushed; a collective issued then runs
    below it, so torch.profiler (the job's own, or the ground truth of the integration tests) records
    one c10d op per call, not one per dispatch level. FLOPs of the step's linear are still counted."""
    from torch.profiler import ProfilerActivity, profile

    net = _Net()
    ag = agent.start(str(tmp_path), what=("comms", "layers"), layers_every=1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        net(torch.ones(2, 4))
        net(torch.ones(2, 4))
    path = ag.status()["trace_file"]
    agent.stop()
    names = [e.name for e in prof.events() if e.name.startswith("c10d::")]
    assert names == ["c10d::allreduce_"] * 2
    with open(path) as f:
        layers = [r for r in map(json.loads, f) if r["k"] == schema.LAYER and r["module"] == "lin"]
    assert layers and all(r["flops"] == 2 * 2 * 4 * 4 for r in layers)


def test_ops_in_flight_at_detach_are_unfinished_not_errors(group, tmp_path) -> None:
    """Issue 9: a detach while an op was in flight wrote "pending-timeout ... op never completed"."""
    ag = agent.start(str(tmp_path), what=("steps",))
    timing = CommTiming(ag)
    comms.install(ag, ag.undo, timing=timing)
    t = torch.ones(8)
    dist.all_reduce(t)  # finished before the detach
    work, later = Work(), Later(timing.cpu, ag.now())  # a p2p op nobody has waited on yet
    ag.emit((schema.COMM, 0, "recv", 32, "float32", "0", 1, (0,), later.token, later, None, True))
    timing.bind(work, later, p2p=True, async_op=None)
    path = ag.status()["trace_file"]
    agent.stop()
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    assert [r for r in recs if r["k"] == schema.ERROR] == []
    assert [r["value"] for r in recs if r.get("key") == schema.META_UNFINISHED_AT_DETACH] == [1]
    assert [(r["op"], r["dur"] is None) for r in recs if r["k"] == schema.COMM] == [
        ("all_reduce", False),
        ("recv", True),
    ]


def test_an_op_issued_while_the_agent_stops_is_no_error(group, tmp_path) -> None:
    """The real Megatron-DeepSpeed detach: a collective issued after the comms collector had counted
    its ops in flight (between its stop step and the unpatching of its wrappers) still reached the
    writer's final flush pending, and was written as "pending-timeout ... op never completed"."""
    ag = agent.start(str(tmp_path), what=("steps",))
    timing = CommTiming(ag)
    comms.install(ag, ag.undo, timing=timing)
    later = Later(timing.cpu, ag.now())  # never bound: issued after the in-flight ops were counted
    ag.emit((schema.COMM, 0, "all_reduce", 32, "float32", "0", 1, (0,), later.token, later, None, True))
    path = ag.status()["trace_file"]
    agent.stop()
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    assert [r for r in recs if r["k"] == schema.ERROR] == []
    assert [(r["op"], r["dur"]) for r in recs if r["k"] == schema.COMM] == [("all_reduce", None)]


def test_collectives_from_cpp_recorded_once_and_dispatcher_restored(group, tmp_path) -> None:
    """A call that reaches the c10d dispatcher without a Python wrapper (the op itself, as DDP's
    Reducer makes it) is recorded by the dispatcher kernel; one through the wrapped method is
    recorded once, not twice; stop restores the dispatcher's table exactly."""
    before = {n: torch._C._dispatch_dump(f"c10d::{n}") for n in ("allreduce_", "broadcast_", "barrier")}
    ag = agent.start(str(tmp_path), what=("steps", "comms"))
    t = torch.ones(4)
    dist.all_reduce(t)  # the Python wrapper's call
    pg = dist.group.WORLD.boxed()
    sum_op = torch.classes.c10d.ReduceOp()  # the script class the op takes; SUM by default
    _, work = torch.ops.c10d.allreduce_([t], pg, sum_op, None, True, -1)
    Work.unbox(work).wait()
    path = ag.status()["trace_file"]
    agent.stop()
    recs = _comm_lines(path)
    assert [(r["op"], r["bytes"]) for r in recs] == [("all_reduce", 16), ("all_reduce", 16)]
    assert all(r["dur"] is not None and r["dur"] >= 0 for r in recs)
    assert {n: torch._C._dispatch_dump(f"c10d::{n}") for n in before} == before


def test_a_group_a_framework_takes_on_later_is_renamed_in_every_record(group, tmp_path, monkeypatch) -> None:
    """DeepSpeed's PipelineEngine broadcasts on its grid's groups before its p2p module keeps the
    grid: under `diag run` those groups stayed bare ids. The writer thread names them once the
    framework holds them, and the reader gives the earlier records the same name."""
    import sys
    import time
    import types

    import diag

    pg = dist.new_group([0])
    agent.start(str(tmp_path), what=("comms",))
    dist.all_reduce(torch.ones(3), group=pg)  # no framework holds it yet: a bare c10d name
    p2p = types.ModuleType("deepspeed.runtime.pipe.p2p")
    p2p._groups = [pg]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.pipe.p2p", p2p)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _groups_renamed(agent.current(), "pp:"):
        time.sleep(0.05)
    dist.all_reduce(torch.ones(3), group=pg)
    agent.stop()
    trace = diag.load(str(tmp_path))
    named = trace.comms[trace.comms["op"] == "all_reduce"]["group"].tolist()
    assert len(named) == 2 and named[0] == named[1] and named[0].startswith("pp:"), named
    groups = trace.layout()["groups"]
    assert named[0] in groups and groups[named[0]]["role"] == "pp"
    assert all(":" in name for name in groups), groups  # the bare entry is only the old name


def _groups_renamed(ag, prefix: str) -> bool:
    """Has the writer thread named a group `prefix...` yet (the comms collector's `Groups`, whose
    `recheck` is an idle listener)?"""
    for listener in list(ag.idle_listeners):
        owner = getattr(getattr(listener, "__wrapped__", None), "__self__", None)
        if owner is not None and hasattr(owner, "seen"):
            return any(name.startswith(prefix) for name in owner.seen)
    return False


class _Group:
    """Stands for the job's process group (weakly referenceable, to see when it is freed)."""


class _AsyncWork:
    """An async call's Work whose future completes when the test says so, on another thread."""

    def __init__(self) -> None:
        self.future: torch.futures.Future = torch.futures.Future()

    def get_future(self) -> torch.futures.Future:
        return self.future

    def complete_later(self, delay_s: float) -> threading.Thread:
        def run() -> None:
            time.sleep(delay_s)
            self.future.set_result(None)

        th = threading.Thread(target=run)
        th.start()
        return th


def test_a_group_is_held_until_its_future_callback_ran(tmp_path) -> None:
    """The public DDP tutorial hung at exit: `main()` returned, DDP's Reducer freed the job's last
    reference to its group, and ~ProcessGroupGloo joined gloo's thread (GIL held) while that thread
    waited for the GIL to run diag's future callback (py-spy --native on the stuck rank). A pending
    callback now holds its group; the writer thread drops it once the callback ran, never the
    callback's own thread (the last reference would join it); a stop lets pending callbacks run."""
    ag = agent.start(str(tmp_path), what=("steps",))
    try:
        timing = CommTiming(ag)
        timing.install(ag.undo)
        work, pg = _AsyncWork(), _Group()
        alive = weakref.ref(pg)
        timing.bind(work, Later(timing.cpu, ag.now()), p2p=False, async_op=True, pg=pg)
        del pg  # the job's last reference
        assert alive() is not None and len(timing.held) == 1
        work.complete_later(0.0).join()
        assert timing.held == {} and alive() is not None  # handed to the writer, not freed here
        deadline = time.monotonic() + 5
        while alive() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive() is None and timing.released == []  # freed by the writer's next flush
        work = _AsyncWork()
        timing.bind(work, Later(timing.cpu, ag.now()), p2p=False, async_op=True, pg=_Group())
        th = work.complete_later(0.2)
        agent.stop()  # waits for the pending callback (at most DRAIN_S) before forgetting
        assert timing.held == {} and timing.released == []  # it ran within the stop
        th.join()
    finally:
        agent.stop()


def test_the_writer_settles_collectives_at_their_declared_spot(group, tmp_path, monkeypatch) -> None:
    """The comms collector declares where its records carry their duration; the writer then looks at
    that field alone (the general look at every field: at most once, to learn the `Later` type)."""
    general: list[object] = []
    look = pending._pending_types
    monkeypatch.setattr(pending, "_pending_types", lambda rec: general.append(rec[0]) or look(rec))
    ag = agent.start(str(tmp_path), what=("comms",))
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    path = ag.status()["trace_file"]
    agent.stop()
    recs = _comm_lines(path)
    assert len(recs) == 5 and all(type(r["dur"]) is int and r["dur"] > 0 for r in recs)
    assert general.count(schema.COMM) <= 1


def test_a_blocking_calls_end_is_read_as_its_wait_returns(group, tmp_path, monkeypatch) -> None:
    """The duration ends when the job's wait returned, not when diag's wait hook got to read the
    clock: a hook slowed by 200 ms (a cold or preempted one is slower by tens of us) adds nothing."""
    finish = Later.finish

    def slow(self: Later, end: int | None = None) -> None:
        time.sleep(0.2)
        finish(self, end)

    monkeypatch.setattr(Later, "finish", slow)
    ag = agent.start(str(tmp_path), what=("comms",))
    dist.all_reduce(torch.ones(4))
    path = ag.status()["trace_file"]
    agent.stop()
    (line,) = _comm_lines(path)
    assert line["op"] == "all_reduce" and 0 < line["dur"] < 0.2e9
