"""A full disk (issue 10): the trace writer never leaves a torn line, writing resumes when space
returns, and the loss (how many lines, which steps, why) is a record in the trace that the reader
and `diag analyze` report. Runs on the 64 kB tmpfs of the agent-limits tests (needs root)."""

from __future__ import annotations

import json
import os
import time

import diag
from diag import agent, schema
from diag.cli import main as cli_main
from diag.trace.writer import TraceFileWriter

FILLER = 24 << 10  # bytes taken from the 64 kB filesystem, freed to let writing resume


def _fill(mnt: str) -> str:
    path = os.path.join(mnt, "filler")
    with open(path, "wb") as f:
        f.write(b"\0" * FILLER)
    return path


def _step(i: int) -> dict:
    return {
        "k": schema.STEP,
        "step": i,
        "ts": 1_700_000_000_000_000_000 + i,
        "dur": 1000,
        "samples": 8,
        "pad": "x" * 200,
    }


def _assert_whole_lines(path: str) -> list[dict]:
    with open(path, "rb") as f:
        raw = f.read()
    assert raw.endswith(b"\n"), raw[-200:]
    return [json.loads(line) for line in raw.splitlines()]  # every line parses: none torn


def test_writer_never_tears_a_line_and_records_the_loss(tiny_tmpfs, capsys) -> None:
    filler = _fill(tiny_tmpfs)
    trace = os.path.join(tiny_tmpfs, "t")
    w = TraceFileWriter(trace, "rank-00000.jsonl")
    w.write_objects([{"k": "header", "schema": schema.SCHEMA_VERSION, "rank": 0, "pid": 1}])
    step = 0
    while w.lines_lost == 0:  # batches of 7 lines of ~280 bytes until the disk is full
        w.write_objects([_step(i) for i in range(step, step + 7)])
        step += 7
    for _ in range(3):  # still full: lost too
        w.write_objects([_step(i) for i in range(step, step + 7)])
        step += 7
    lines = _assert_whole_lines(w.path)
    first_lost = lines[-1]["step"] + 1  # what fitted of the first failed batch is kept
    assert step - 7 * 4 < first_lost <= step - 7 * 3
    n_lost = step - first_lost
    assert w.last_error == "ENOSPC" and w.lines_lost == n_lost
    os.unlink(filler)  # space returns
    w.write_objects([_step(step)])
    w.close()
    lines = _assert_whole_lines(w.path)
    lost = [x for x in lines if x["k"] == schema.LOST]
    assert len(lost) == 1
    assert (lost[0]["lines"], lost[0]["first_step"], lost[0]["last_step"], lost[0]["error"]) == (
        n_lost,
        first_lost,
        step - 1,
        "ENOSPC",
    )
    assert lines[-1]["step"] == step  # resumed after the loss
    assert [x["step"] for x in lines if x["k"] == schema.STEP] == [*range(first_lost), step]
    tr = diag.load(trace)
    assert [str(p) for p in tr.problems] == [
        f"{w.path}: {n_lost} lines lost while writing the trace (ENOSPC), steps {first_lost}-{step - 1}"
    ]
    assert not tr.truncated
    assert cli_main(["analyze", "-q", trace]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"diag analyze: error: {w.path}: {n_lost} lines lost while writing the trace (ENOSPC), "
        f"steps {first_lost}-{step - 1}\n"
    )


def test_agent_writer_thread_resumes_after_a_full_disk(tiny_tmpfs) -> None:
    filler = _fill(tiny_tmpfs)
    ag = agent.start(tiny_tmpfs, what=("steps",))
    i = 0
    deadline = time.monotonic() + 20
    while ag.status()["lines_lost"] == 0 and time.monotonic() < deadline:
        for _ in range(200):
            ag.emit((schema.STEP, i, ag.now(), 1000, 8, None, True))
            i += 1
        ag.flush()
        time.sleep(0.05)
    lost = ag.status()["lines_lost"]
    assert lost > 0 and ag.status()["write_error"] == "ENOSPC"
    os.unlink(filler)
    ag.emit((schema.STEP, i, ag.now(), 1000, 8, None, True))
    path = ag.status()["trace_file"]
    agent.stop()
    lines = _assert_whole_lines(path)
    (rec,) = [x for x in lines if x["k"] == schema.LOST]
    assert rec["lines"] >= lost and rec["error"] == "ENOSPC"
    # the first batch lost may hold only step-less lines (the stats heartbeat, the sched sample):
    # then no step was lost and the record says so (null)
    assert rec["last_step"] is None or rec["last_step"] <= i - 1
    tr = diag.load(tiny_tmpfs)
    assert not tr.truncated
    assert any("lines lost while writing the trace (ENOSPC)" in str(p) for p in tr.problems)
    assert tr.steps["step"].max() == i  # the step emitted after space returned is in the trace
