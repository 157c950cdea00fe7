"""The agent's `comm_open` records: a collective still waited in after `OPEN_S` is on disk at once
(once per call), its `comm` record follows when it completes; readers count it once."""

from __future__ import annotations

import json
import time

import pytest
from diag.analyzers import liveness
from diag.collectors.comms.timing import Later
from diag.collectors.device.cpu import CpuTimer

from diag import agent, schema
from diag.agent import pending
from diag.metrics.stage import Metrics
from diag.trace.reader import load_trace


def _lines(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _wait_for(path: str, kind: str, timeout: float = 10.0) -> list[dict]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = [r for r in _lines(path) if r["k"] == kind]
        if got:
            return got
        time.sleep(0.05)
    return []


def test_a_call_waited_in_is_announced_once_then_written_when_it_completes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(pending, "OPEN_S", 0.3)
    ag = agent.start(str(tmp_path), what=("steps",))
    path = ag.status()["trace_file"]
    timer = CpuTimer()
    stuck, done = Later(timer, ag.now()), Later(timer, ag.now())
    ag.emit((schema.COMM, 3, "broadcast", 64, "float32", "0", 2, (0, 1), stuck.token, stuck, None, False))
    ag.emit((schema.COMM, 3, "all_reduce", 32, "float32", "0", 2, (0, 1), done.token, done, None, True))
    opened = _wait_for(path, schema.COMM_OPEN)
    time.sleep(0.6)  # more flushes while both are held: still one announcement each
    done.finish()
    written = _wait_for(path, schema.COMM)
    agent.stop()
    recs = _lines(path)
    assert [(r["op"], r["step"], r["bytes"], r["dur"]) for r in opened] == [
        ("broadcast", 3, 64, None),
        ("all_reduce", 3, 32, None),
    ]
    assert [r["op"] for r in recs if r["k"] == schema.COMM_OPEN] == ["broadcast", "all_reduce"]
    assert [(r["op"], r["dur"] is None) for r in written] == [("all_reduce", False)]
    # read back: the completed call counts once (its comm record), the one still waited in once
    trace = load_trace(str(tmp_path))
    c = liveness.entered(trace, Metrics(trace))
    assert sorted((r.op, r.dur != r.dur or r.dur is None) for r in c.itertuples()) == [
        ("all_reduce", False),
        ("broadcast", True),
    ]


def test_a_quick_call_is_never_announced(tmp_path) -> None:
    ag = agent.start(str(tmp_path), what=("steps",))
    path = ag.status()["trace_file"]
    later = Later(CpuTimer(), ag.now())
    ag.emit((schema.COMM, 0, "all_reduce", 32, "float32", "0", 2, (0, 1), later.token, later, None, False))
    later.finish()
    assert _wait_for(path, schema.COMM)
    time.sleep(pending.OPEN_S + 0.3)
    agent.stop()
    assert [r for r in _lines(path) if r["k"] == schema.COMM_OPEN] == []


@pytest.mark.parametrize("held_s", [0.0, 5.0])
def test_entered_announces_only_held_collectives_past_open_s(held_s: float) -> None:
    later = Later(CpuTimer(), 0)
    rec = (schema.COMM, 1, "all_reduce", 8, None, "0", 2, (0, 1), 0, later, None, False)
    other = (schema.LAYER, 1, "lin", "fwd", 0, later, None, None)
    e = pending.Entered()
    got = e.announce([(100.0, rec), (100.0, other)], 100.0 + held_s)
    assert got == ([(schema.COMM_OPEN, *rec[1:9], None, None, False)] if held_s else [])
    assert e.announce([(100.0, rec)], 100.0 + held_s) == []
