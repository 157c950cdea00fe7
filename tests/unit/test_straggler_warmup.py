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
