"""A rank that turns slow mid-run is named within a few of its slow steps; a healthy run's short
stretches of one slower rank are not.

Fixtures, both real runs cut to a window of steps (every record of another step dropped):
- straggler_onset: tests/workloads/ddp.py (2 ranks, gloo) under the fault matrix's harness; rank 1
  got SIGUSR2 during step 573 and slept 80 ms in its compute of every step from 574 on
  (`--slow-on-usr2`). Steps 485-589: 89 on par, then 16 slow.
- healthy_blip: the public PyTorch DDP tutorial (examples' multigpu_torchrun.py, CPU/gloo, 2 ranks)
  under `diag run`, healthy; steps 6320-6459, where rank 0 was 2-3 ms slower on 9 consecutive
  steps of about 1.4 ms (28 ms in all: the longest such stretch of 45 real healthy traces)."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from diag.analyzers import run_all, straggler

import diag
from diag.findings import Finding
from diag.metrics.onset import _trimmed, slow_runs
from diag.metrics.stage import Metrics
from diag.trace.model import Trace
from tests.conftest import ROOT

ONSET = os.path.join(ROOT, "tests", "fixtures", "straggler_onset")
BLIP = os.path.join(ROOT, "tests", "fixtures", "healthy_blip")
FIRST_SLOW = 574


def _cut(trace: Trace, last: int) -> Trace:
    """The trace as a live watcher had it once step `last` was written."""
    frames = {k: df[df["step"] <= last] if "step" in df else df for k, df in trace.frames.items()}
    return Trace(headers=trace.headers, frames=frames, sources=trace.sources)


def _alarms(trace: Trace) -> list[Finding]:
    findings, failures = run_all(trace)
    assert failures == {}
    return [f for f in findings if f.severity in ("warning", "critical")]


def test_a_rank_slow_from_mid_run_is_named_with_the_step_it_turned_slow():
    (f,) = _alarms(diag.load(ONSET))
    assert f.rule == "straggler" and f.ranks == [1] and f.severity == "critical"
    assert f.title.startswith(f"rank 1 is a straggler since step {FIRST_SLOW}:")
    assert f.evidence["since_step"] == FIRST_SLOW and f.evidence["baseline_steps"] >= 20
    # priced over the slow steps alone: its ~80 ms a step its peer waited
    assert f.evidence["time_lost_s"] == pytest.approx(16 * 0.08, rel=0.15)


def test_named_after_three_of_its_slow_steps_not_before():
    trace = diag.load(ONSET)
    named = [
        last
        for last in range(FIRST_SLOW - 3, FIRST_SLOW + 6)
        if any(f.ranks == [1] for f in straggler.straggler(_cut(trace, last), Metrics(_cut(trace, last))))
    ]
    assert named and named[0] == FIRST_SLOW + 2


def test_the_whole_run_test_alone_misses_it(monkeypatch):
    """Why the onset exists: rank 1 is the slowest on 16 of 105 steps and its median compute is its
    healthy one."""
    monkeypatch.setattr(straggler, "_by_onset", lambda *a: [])
    assert _alarms(diag.load(ONSET)) == []


def test_a_healthy_runs_short_slower_stretch_is_not_named():
    assert _alarms(diag.load(BLIP)) == []


def test_the_stretch_meets_every_premise_but_the_time_it_cost(monkeypatch):
    """The healthy stretch is slower by every ratio and margin: only its 28 ms in all (a hiccup, not
    a straggler's 0.2 s) keeps it quiet."""
    monkeypatch.setattr(straggler, "ONSET_EXCESS_S", 0.0)
    (f,) = _alarms(diag.load(BLIP))
    assert f.rule == "straggler" and f.ranks == [0]


def test_one_step_between_two_slow_ones_does_not_split_the_run():
    flags = pd.Series([False, True, False, True, True, False, False, True])
    assert slow_runs(flags) == [(1, 4), (7, 1)]
    assert slow_runs(flags, bridge=0) == [(1, 1), (3, 2), (7, 1)]


def test_a_small_blip_bridged_before_the_change_is_not_where_it_began():
    """Step 381 of a real run: rank 1 5 ms slower, 382 on par, 383 on 80-100 ms slower (the run was
    found from 381, and said "since step 381")."""
    gap = pd.Series([0.005, 0.0026, 0.088, 0.107, 0.091])
    assert _trimmed(gap, 100) == (102, 3)
