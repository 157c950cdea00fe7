"""No harm: with every collector raising, and with slow hooks while the trace's disk is full, the real
2-rank DeepSpeed job trains to bit-identical losses; the agent counts what it failed or lost and says
so in the trace (error / stats events) and in `diag status`. The agent is attached to the running
job (the real path) with per-layer sampling on every step, so every collector is busy."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from diag import load
from diag.agent import ALL_COLLECTORS
from diag.control.client import request
from tests.reliability import jobs
from tests.workloads import launch

pytestmark = pytest.mark.slow
# memory is a step listener: with the steps hook raising, no step boundary ever reaches it
CALLED = set(ALL_COLLECTORS) - {"memory"}


def _statuses(held: jobs.Held) -> list[dict[str, Any]]:
    """`diag status --json` (every attached process of this user), one dict per rank."""
    res = launch.diag_cli("status", "--json", env=held.env)
    assert res.returncode == 0, res.stderr
    return sorted((json.loads(line) for line in res.stdout.splitlines()), key=lambda s: s["rank"])


def test_every_collector_raising(tmp_path, baseline, runtime_env) -> None:
    env = {**runtime_env, "DIAG_FAULTS": ",".join(f"{c}=raise" for c in ALL_COLLECTORS)}
    held = jobs.start(str(tmp_path / "job"), env=env)
    trace = str(tmp_path / "trace")
    try:
        held.wait_steps(1)
        held.attach(trace_dir=trace, layers_every=1)
        held.wait_steps(held.steps() + 4)
        statuses = _statuses(held)
        assert [s["rank"] for s in statuses] == [0, 1]
        for st in statuses:
            assert {c for c, n in st["errors"].items() if n > 0} == CALLED, st["errors"]
            assert {m[2] for m in st["error_messages"]} == {"InjectedFault"}
        held.detach()
        result = held.finish()
    finally:
        held.kill()
    jobs.assert_same_training(result, baseline)
    jobs.assert_clean(result, baseline)
    tr = load(trace)
    assert tr.problems == []
    for r in (0, 1):
        errs = tr.errors[tr.errors["rank"] == r]
        assert set(errs["exc"].astype(str)) == {"InjectedFault"}
        assert set(errs["collector"].astype(str)) == CALLED
        latest = errs.groupby(["collector", "where", "exc"], observed=True)["count"].max()
        counted = latest.groupby(level="collector", observed=True).sum().to_dict()
        last = tr.stats[tr.stats["rank"] == r].iloc[-1]["errors"]  # the final flush writes both
        assert {c: last[c] for c in CALLED} == counted


def test_slow_hooks_and_a_full_disk(tmp_path, baseline, runtime_env, tiny_tmpfs) -> None:
    env = {**runtime_env, "DIAG_FAULTS": ",".join(f"{c}=sleep:0.0005" for c in ALL_COLLECTORS)}
    held = jobs.start(str(tmp_path / "job"), env=env)
    trace = os.path.join(tiny_tmpfs, "trace")
    try:
        held.wait_steps(1)
        held.attach(trace_dir=trace, layers_every=1)
        deadline = time.monotonic() + 60
        while not all(request(pid, "status")["lines_lost"] > 0 for pid, _ in held.ranks()):
            assert time.monotonic() < deadline, "the 64 kB trace disk never filled"
            time.sleep(0.2)
        text = launch.diag_cli("status", env=held.env)
        assert text.returncode == 0, text.stderr
        assert text.stdout.count("lines lost (ENOSPC)") == 2, text.stdout
        for st in _statuses(held):
            assert st["errors"] == {} and st["write_error"] == "ENOSPC"  # slow is not failed
            assert sum(st["captured"].values()) > 0
        held.detach()
        result = held.finish()
    finally:
        held.kill()
    jobs.assert_same_training(result, baseline)
    jobs.assert_clean(result, baseline)
    tr = load(trace)  # what fitted is readable; at most a cut last line per file
    assert set(tr.ranks) == {0, 1}
    # at most a cut last line per file, and the writer's own record of what the full disk cost
    assert all(p.truncated or "lost while writing the trace (ENOSPC)" in p.message for p in tr.problems), [
        str(p) for p in tr.problems
    ]
