"""The writer thread's flush writes every record as the general path would (`dumps(to_json(rec))`
of the settled record), in the order rules of `diag.agent.pending`: records held from an earlier
flush first, then this flush's in order, then the `comm_open` of each held collective; a record whose
duration is not known yet is held, never lost, and given up (null) by the final flush."""

from __future__ import annotations

import itertools
import json
import time

from diag.collectors import comms

from diag import schema
from diag.agent import AgentOptions, pending
from diag.agent.runtime import Agent
from diag.trace.writer import TraceFileWriter, dumps
from tests.unit.test_comm_line import P0
from tests.unit.test_comm_line import rec as comm_rec
from tests.unit.test_pending_spot import _later


class Sub(str):
    pass


def _comm(ts: int, dur: object, **kw: object) -> tuple[object, ...]:
    return comm_rec(ts=P0 + ts, dur=dur, **{"module": "m.a", **kw})


def _settled(rec: tuple[object, ...], give_up: bool = False) -> tuple[object, ...]:
    return pending.resolve(rec, give_up=give_up)


def _agent(tmp_path) -> Agent:
    ag = Agent(AgentOptions(trace_dir=str(tmp_path)))
    ag._file = TraceFileWriter(str(tmp_path), "rank-00000.jsonl")
    ag._last_stats = float("inf")  # no heartbeat in the way (its values are the moment's)
    return ag


def _records(path: str) -> list[str]:
    with open(path) as f:
        return [line.rstrip("\n") for line in f if json.loads(line)["k"] not in ("sched", "stats")]


def test_each_line_is_the_general_line_in_the_pending_order(tmp_path, monkeypatch):
    monkeypatch.setitem(pending._SPOTS, (schema.COMM, comms.RECORD_LEN), comms.DUR_AT)
    monkeypatch.setattr(pending, "OPEN_S", 0.0)  # a held collective is announced at its first flush
    ag = _agent(tmp_path)
    w0, p0 = ag._wall0, ag._perf0
    unready, gpu_like = _later(None), _later(None)
    first = [
        _comm(1, _later(12_345)),
        _comm(2, 999, module=None, async_op=None),
        _comm(3, _later(0), op="all_gather", group_size=4, group_ranks=(0, 1, 2, 3), async_op=True),
        _comm(4, _later(7), dtype=None, group_ranks=None, group_size=8, op="reduce_scatter"),
        _comm(5, _later(5), bytes=4096.0),  # another type: the general way, same line
        _comm(6, _later(5), group_ranks=[0, 1]),
        _comm(7, unready),  # held
        _comm(8, _later(3), group=Sub("g"), module='odd "m"\u00e9'),
        (schema.STEP, 7, P0 + 10, 65_000_000, 32, None, True),
        (schema.MEMORY, 8, P0 + 12, "cpu", None, None, None, 270_000, 1_234_567, None),
        (schema.OVERFLOW, 8, P0 + 13, True, float("nan"), 1.0, 1, "deepspeed_fp16"),
        (schema.META, P0 + 15, "groups", {"dp:0": {"size": 2}}),
        (schema.LAYER, 8, "m.a", "bwd", P0 + 18, gpu_like, 0, None),  # held: no declared spot
    ]
    for rec in first:
        ag.emit(rec)
    ag._flush(final=False)
    written = [r for r in first if r[-3] is not unready and gpu_like not in r]
    want = [dumps(schema.to_json(_settled(r), w0, p0)) for r in written]
    want.append(dumps(schema.to_json((schema.COMM_OPEN, *_settled(first[6], give_up=True)[1:]), w0, p0)))
    assert _records(ag._file.path) == want
    assert ag._held and len(ag._held) == 2

    unready.dur, gpu_like.dur = 4242, 77  # settled by the next flush: written first, in held order
    late = _comm(21, _later(None), step=9)
    ag.emit((schema.STEP, 9, P0 + 20, 1, 2, 3, None))
    ag.emit(late)
    ag._flush(final=False)
    want += [dumps(schema.to_json(_settled(r), w0, p0)) for r in (first[6], first[-1])]
    want.append(dumps(schema.to_json((schema.STEP, 9, P0 + 20, 1, 2, 3, None), w0, p0)))
    want.append(dumps(schema.to_json((schema.COMM_OPEN, *_settled(late, give_up=True)[1:]), w0, p0)))
    assert _records(ag._file.path) == want

    ag._flush(final=True)  # stopping: the one still in flight is written with a null duration
    want.append(dumps(schema.to_json(_settled(late, give_up=True), w0, p0)))
    assert _records(ag._file.path) == want
    assert not ag._held and not ag.errors
    counts = {"comm": 9, "step": 2, "memory": 1, "overflow": 1, "meta": 1, "layer": 1, "comm_open": 2}
    assert ag.captured == counts


def test_a_record_that_cannot_be_written_is_one_lost_record(tmp_path, monkeypatch):
    """A malformed record (a byte count too large for a float, an unknown kind) is counted and
    reported as the agent's format error; the records around it are written."""
    monkeypatch.setitem(pending._SPOTS, (schema.COMM, comms.RECORD_LEN), comms.DUR_AT)
    ag = _agent(tmp_path)
    good = (schema.STEP, 1, P0, 5, 8, None, True)
    for rec in (good, _comm(1, _later(1), bytes=10**400), ("no-such-kind", 1, 2), good):
        ag.emit(rec)
    ag._flush(final=False)
    line = dumps(schema.to_json(good, ag._wall0, ag._perf0))
    assert _records(ag._file.path)[:2] == [line, line]
    assert [k[1:] for k in ag.errors] == [
        ("format:comm", "OverflowError"),
        ("format:no-such-kind", "KeyError"),
    ]
    assert ag.captured == {"step": 2, "comm": 1, "no-such-kind": 1}


def test_resolvers_complete_records_in_order_and_a_raising_one_loses_one_record(tmp_path, monkeypatch):
    """Each record goes through its kind's resolver in record order (comms' matching counts
    occurrences) inside the flush's one loop; a resolver that raises loses that record only, counted
    as the agent's `resolve:` error, and the records around it are written."""
    monkeypatch.setitem(pending._SPOTS, (schema.COMM, comms.RECORD_LEN), comms.DUR_AT)
    ag = _agent(tmp_path)
    w0, p0 = ag._wall0, ag._perf0
    seen: list[int] = []

    def resolve(rec: tuple[object, ...]) -> tuple[object, ...]:
        seen.append(rec[1])  # type: ignore[arg-type]
        if rec[1] == 2:
            raise ValueError("broken")
        return (*rec[: comms.MODULE_AT], f"m.{rec[1]}", *rec[comms.MODULE_AT + 1 :])

    ag.resolvers[schema.COMM] = resolve
    step = (schema.STEP, 1, P0, 5, 8, None, True)
    recs = [_comm(1, _later(10), step=1), step, _comm(2, _later(10), step=2), _comm(3, _later(10), step=3)]
    for rec in recs:
        ag.emit(rec)
    ag._flush(final=False)
    assert seen == [1, 2, 3]
    written = [resolve(recs[0]), step, resolve(recs[3])]
    lines = [line for line in _records(ag._file.path) if json.loads(line)["k"] != "error"]
    assert lines == [dumps(schema.to_json(_settled(r), w0, p0)) for r in written]
    assert list(ag.errors) == [("agent", "resolve:comm", "ValueError")]
    assert ag.captured == {"comm": 2, "step": 1}


def _sched_times(ag: Agent, steps: int, gap: float) -> list[float]:
    """Start `ag`, emit `steps` step records `gap` s apart, stop it: its flushes' sched samples'
    times in seconds (one sample a flush that wrote), in the order written."""
    ag.start()
    try:
        for i in range(steps):
            ag.emit((schema.STEP, i, ag.now(), 5, 8, None, True))
            time.sleep(gap)
        path = ag.status()["trace_file"]
    finally:
        ag.stop()
    with open(path) as f:
        return [json.loads(line)["ts"] / 1e9 for line in f if json.loads(line)["k"] == "sched"]


def test_the_writer_flushes_on_ticks_of_the_wall_clock(tmp_path):
    """Every rank's writer flushes at the same moments (multiples of FLUSH_INTERVAL_S on the wall
    clock), so ranks killed at once leave records that end together; each flush's sched sample is
    taken right after its tick (the first and the stop's aside)."""
    from diag.agent import runtime

    ag = Agent(AgentOptions(trace_dir=str(tmp_path), what=("steps",)))
    samples = _sched_times(ag, 14, 0.25)  # ~3.5 s of records (6-7 flushes), one every 0.25 s
    every = runtime.FLUSH_INTERVAL_S
    phases = sorted(ts % every for ts in samples[1:-1])  # not the first nor the stop's
    assert len(phases) >= 2
    assert phases[len(phases) // 2] < every / 4, phases  # most within a quarter interval of a tick


def test_an_unsettled_idle_listener_runs_between_the_flush_ticks(tmp_path):
    """A listener waiting for a framework still being imported runs every LISTEN_INTERVAL_S (a late
    import is patched before the job's first step), while records are written on the flush ticks
    only (each flush's sched sample: one per FLUSH_INTERVAL_S, not one per wake)."""
    from diag.agent import runtime

    ag = Agent(AgentOptions(trace_dir=str(tmp_path), what=()))
    calls: list[float] = []
    ag.idle_listeners.append(lambda: calls.append(time.time()))  # None: never settled
    samples = _sched_times(ag, 25, 0.1)  # ~2.5 s, a record every 0.1 s: each flush has something to write
    listen_gaps = sorted(b - a for a, b in itertools.pairwise(calls))
    flush_gaps = sorted(b - a for a, b in itertools.pairwise(samples[:-1]))  # not the stop's
    assert len(listen_gaps) >= 5 and len(flush_gaps) >= 2, (calls, samples)
    assert listen_gaps[len(listen_gaps) // 2] < (runtime.LISTEN_INTERVAL_S + runtime.FLUSH_INTERVAL_S) / 2
    assert flush_gaps[len(flush_gaps) // 2] > runtime.FLUSH_INTERVAL_S * 0.8, samples


def test_the_next_wake_survives_a_clock_set_back_and_keeps_a_passed_tick(tmp_path):
    """A flush tick more than an interval ahead (the wall clock was set back an hour) is replaced by
    the next one from now, not waited for; a tick a listener ran past is still due (flushed at once);
    an unsettled listener wakes the writer on the listen ticks before the flush tick."""
    from diag.agent import runtime

    every, listen = runtime.FLUSH_INTERVAL_S, runtime.LISTEN_INTERVAL_S
    ag = _agent(tmp_path)
    now = 1000 * every + every / 10  # just past a flush tick
    assert ag._next_wake(now + 3600.0, now) == (1001 * every, 1001 * every)
    assert ag._next_wake(now - every / 20, now) == (now - every / 20, now - every / 20)
    ag.idle_listeners.append(lambda: None)
    due, wake = ag._next_wake(1001 * every, now)
    assert due == 1001 * every and now < wake < due and round(wake / listen, 6) % 1 == 0
