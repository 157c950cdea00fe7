"""bench/overhead's self-timed split: the fixed cost per step apart from comms and the writer, per
rank-step over the self-timed blocks' counted steps."""

from __future__ import annotations

from bench.overhead import SELF_SKIP, split_line


def test_the_fixed_part_is_the_step_collectors_per_rank_step() -> None:
    # 2 ranks x 2 blocks of 10 steps, 8 counted each (SELF_SKIP = 2): steps 800 us + overflow 400 us
    # a block are 100 + 50 us a rank-step; comms 1,600 us a block, 200 us; the writer 80 us
    block = {"steps": 800_000, "overflow": 400_000, "comms": 1_600_000, "writer": 640_000}
    ranks = [{"own_by": [block, block]}, {"own_by": [block, block]}]
    line = split_line(ranks, 10 - SELF_SKIP)
    assert line == (
        "by part, us per rank-step: fixed per step 150.0 (steps 100.0 + overflow 50.0); "
        "comms 200.0, writer 80.0"
    )
    assert split_line([{"own_by": []}], 8) == "by part: n/a"
