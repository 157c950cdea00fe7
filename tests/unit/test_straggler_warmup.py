"""How soon the straggler rule may speak on a job diag follows from its start (issue 17): never from
the arrival order of a job's first steps (warm-up work lands on one rank; the count of arrivals is
not the wait)."""

from __future__ import annotations

from tests.unit.synth_trace import Job, fired


def test_no_verdict_from_the_arrival_order_of_a_jobs_first_steps(tmp_path):
    """Two steps in which rank 0 arrives last at every one of 40 collectives (its set-up work): the
    arrival order speaks for one profiled step only."""
    job = Job(steps=2, step_ms=200)
    for s in range(2):
        for i in range(20):
            job.comm(0, s, at_ms=4 * i + 3.5, dur_ms=1.0)
            job.comm(1, s, at_ms=4 * i + 0.5, dur_ms=4.0)
    assert fired(job.write(str(tmp_path)), "straggler") == []


def _early(tmp_path, late_ms: list[float], steps: list[int] | None = None) -> object:
    """Steps 0-3 (step 0 is warm-up: 3 compared) of 150 ms: rank 1 arrives `late_ms[i]` late at the
    all-reduce of step i + 1, rank 0 waits that long in it. `steps`: the step numbers written."""
    job = Job(steps=4, step_ms=150)
    for i, s in enumerate(steps or [1, 2, 3]):
        job.comm(0, s, at_ms=30, dur_ms=5 + late_ms[i])
        job.comm(1, s, at_ms=30 + late_ms[i], dur_ms=5)
    job.comm(0, 0, at_ms=30, dur_ms=5)
    job.comm(1, 0, at_ms=30, dur_ms=5)
    return job.write(str(tmp_path))


def test_three_steps_name_a_steady_straggler_within_five(tmp_path):
    """A planted 80 ms straggler over 3 compared steps (its gaps 80, 98, 98 ms on the recorded sample):
    named (the issue: within 5 steps); a loaded host's swinging gaps (23, 37, 21 ms on the recorded
    DDP control, 7.7 robust sigma but 2.6 standard deviations) are not."""
    (f,) = fired(_early(tmp_path / "a", [80, 98, 98]), "straggler")
    assert f.ranks == [1] and f.evidence["slowest_share"] == 1.0
    assert fired(_early(tmp_path / "b", [23, 37, 21]), "straggler") == []
    # slower on 2 of 3 only: not the slowest on every one
    assert fired(_early(tmp_path / "c", [80, 0, 98]), "straggler") == []
