"""Severity follows the share of the time at stake a finding costs, the same for every rule that can
price itself (issue 11): measured on real trace files, with the time lost stated in the finding."""

from __future__ import annotations

import pytest
from diag.analyzers import run_all

from diag.findings import CRITICAL_SHARE, WARNING_SHARE, Cost, severity_of
from tests.unit.synth_trace import Job


def test_thresholds_are_shares_of_the_time_at_stake():
    assert severity_of(0.02) == "info"
    assert severity_of(WARNING_SHARE) == "warning"
    assert severity_of(0.2) == "warning"
    assert severity_of(CRITICAL_SHARE) == "critical"
    assert severity_of(0.3) == "critical"


def test_cost_states_the_time_lost():
    c = Cost(0.012, 0.040)
    assert c.severity == "critical" and c.share == pytest.approx(0.3)
    assert c.text == "costs 12.0 ms of every 40.0 ms step (30%)"
    assert Cost(3.0, 120.0, "logged").text == "costs 3.00 s of 120.00 s logged (2%)"
    assert Cost(1.0, 0.0).share == 0.0 and Cost(5.0, 1.0).share == 1.0  # no step: nothing at stake
    assert Cost(0.012, 0.040).evidence()["time_lost_share"] == pytest.approx(0.3)


def _finding(tmp_path, job: Job, rule: str):
    found = [f for f in run_all(job.write(str(tmp_path)), only=[rule])[0] if f.rule == rule]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(("gap_ms", "severity"), [(20.0, "warning"), (60.0, "critical")])
def test_idle_between_steps_scales_with_the_idle_share(tmp_path, gap_ms, severity):
    """100 ms steps: 20 ms idle is 17% of the wall time (a warning), 60 ms is 38% (critical)."""
    f = _finding(tmp_path, Job(gap_ms=gap_ms), "idle_between_steps")
    assert f.severity == severity
    assert f.evidence["time_lost_share"] == pytest.approx(gap_ms / (100 + gap_ms), abs=0.02)
    assert "ms of every" in f.detail


@pytest.mark.parametrize(("n", "severity"), [(40, "warning"), (60, "critical")])
def test_tiny_collectives_scale_with_their_share(tmp_path, n, severity):
    """n all-reduces of 4 KiB, 0.5 ms each, in a 100 ms step: 20 ms (20%) warns, 30 ms (30%) is critical."""
    job = Job()
    job.each_step(lambda r, s: [job.comm(r, s, nbytes=4096, at_ms=10 + i, dur_ms=0.5) for i in range(n)])
    f = _finding(tmp_path, job, "tiny_collectives")
    assert f.severity == severity
    assert f.evidence["time_lost_s"] == pytest.approx(n * 0.5e-3, rel=0.05)
