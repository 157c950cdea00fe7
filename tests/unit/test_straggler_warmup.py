"""How soon the straggler rule may speak on a job diag follows from its start (issue 17): never from
the arrival order of a job's first steps (warm-up work lands on one rank; the count of arrivals is
not the wait)."""

from __future__ import annotations

import json
import os

import diag
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


def test_a_live_jobs_first_mark_without_duration_is_not_one_profiled_step(tmp_path):
    """The same two steps as a live job writes them: the first step mark has no duration (the agent
    marks a step's start; its duration comes with the next), so one step has a duration. It is still
    a job's first two steps (a healthy ZeRO-3 control's rank 0 kept its peer waiting at 83% of step
    2's collectives): no verdict from arrival order; one step mark alone keeps it."""
    job = Job(steps=2, step_ms=200)
    for s in range(2):
        for i in range(20):
            job.comm(0, s, at_ms=4 * i + 3.5, dur_ms=1.0)
            job.comm(1, s, at_ms=4 * i + 0.5, dur_ms=4.0)
    job.write(str(tmp_path))
    for r in range(2):
        path = os.path.join(str(tmp_path), f"rank-{r:05d}.jsonl")
        with open(path) as f:
            recs = [json.loads(x) for x in f]
        for rec in recs:
            if rec["k"] == "step" and rec["step"] == 0:
                rec["dur"] = None
        with open(path, "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in recs)
    assert fired(diag.load(str(tmp_path)), "straggler") == []
