"""A straggler from arrival order when only one step was profiled: the others wait for one rank in
most collectives. A healthy single step (whoever is last changes) stays silent."""

from __future__ import annotations

import random

from tests.unit.synth_trace import Job, fired


def _one_step(tmp_path, late_rank: int | None) -> object:
    job = Job(ranks=4, steps=1, step_ms=200.0)
    rnd = random.Random(7)
    for i in range(40):
        last = late_rank if late_rank is not None else rnd.randrange(4)
        for r in range(4):
            wait = 0.0 if r == last else (3.0 if late_rank is not None else rnd.uniform(0, 0.2))
            job.comm(
                r,
                0,
                at_ms=4 * i + (3.0 if r == last and late_rank is not None else 0) + 0.5,
                dur_ms=1.0 + wait,
            )
    return job.write(str(tmp_path))


def test_single_step_straggler_from_arrival_order(tmp_path):
    (f,) = fired(_one_step(tmp_path, late_rank=2), "straggler")
    assert f.ranks == [2] and f.evidence["last_share"] == 1.0 and f.evidence["steps"] == 1
    assert f.evidence["others_wait_s"] >= 0.1  # 40 collectives x 3 ms


def test_single_healthy_step_is_silent(tmp_path):
    assert fired(_one_step(tmp_path, late_rank=None), "straggler") == []
