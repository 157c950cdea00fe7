"""Overflow records from real fp16 / bf16 DeepSpeed runs on 2 forked ranks (Megatron's grad scaler:
tests/unit/test_overflow.py)."""

from __future__ import annotations

from typing import Any

import pytest

import diag
from tests.integration.ds_harness import ds_config, run_ranks, train

STEPS = 5
WHAT = ("steps", "memory", "overflow")
FAULTS = {"memory": "raise", "overflow": "raise"}  # steps faults: test_steps.py


def _job(rank: int, root: str) -> dict[str, Any]:
    """Every scenario in one pair of ranks (start-up is paid once); one trace folder each."""
    z0 = ds_config(stage=0, dtype="fp16")
    return {
        # stage 0: an inf in rank 1's (already all-reduced) gradient makes only rank 1 skip
        "z0": train(rank, z0, STEPS, f"{root}/z0", inf_grad=(1, 2), what=WHAT),
        "z0_faults": train(rank, z0, STEPS, f"{root}/z0_faults", inf_grad=(1, 2), what=WHAT, faults=FAULTS),
        "z0_bare": train(rank, z0, STEPS, None, inf_grad=(1, 2)),
        # stage 2: an inf in rank 0's loss; ZeRO agrees on overflow across ranks: both skip
        "z2": train(rank, ds_config(stage=2, dtype="fp16"), STEPS, f"{root}/z2", inf_loss=(0, 3), what=WHAT),
        "bf16": train(
            rank,
            ds_config(stage=1, dtype="bf16", gradient_clipping=1.0),
            4,
            f"{root}/bf16",
            inf_loss=(0, 3),
            what=WHAT,
        ),
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("overflow")
    return str(root), run_ranks(root, _job, str(root))


def _rank(frame: Any, rank: int) -> Any:
    return frame[frame["rank"] == rank].sort_values("step")


def _check_fp16(tr: Any, results: list[dict[str, Any]], scenario: str) -> None:
    for rank, res in enumerate(results):
        r = res[scenario]
        ov = _rank(tr.overflow, rank)
        # one record per optimizer step, numbered as DeepSpeed counts it (global_steps once taken)
        assert list(ov["step"]) == list(range(1, r["global_steps"] + 1))
        assert (ov["source"] == "deepspeed_fp16").all()
        assert list(ov["scale_after"]) == r["scales"]  # what the engine itself reports
        hit = ov[ov["overflow"]]
        assert len(hit) == r["skipped_steps"] == int(ov["skipped_steps"].iloc[-1])
        assert (hit["scale_after"] == hit["scale_before"] / 2).all()  # 2^k -> 2^(k-1)
        applied = _rank(tr.steps, rank)
        assert list(applied["applied"]) == r["applied"]
        assert set(applied[~applied["applied"].astype(bool)]["step"]) == set(hit["step"])


@pytest.mark.slow
def test_stage0_overflow_on_one_rank_only(job):
    root, results = job
    tr = diag.load(f"{root}/z0")
    _check_fp16(tr, results, "z0")
    assert [r["z0"]["skipped_steps"] for r in results] == [0, 1]
    hit = tr.overflow[tr.overflow["overflow"]]
    assert list(hit["rank"]) == [1] and list(hit["step"]) == [3]  # poisoned at global_steps 2: step 3
    assert hit["scale_before"].iloc[0] == 2.0 ** ds_config(dtype="fp16")["fp16"]["initial_scale_power"]


@pytest.mark.slow
def test_stage2_overflow_on_every_rank(job):
    root, results = job
    tr = diag.load(f"{root}/z2")
    _check_fp16(tr, results, "z2")
    assert [r["z2"]["skipped_steps"] for r in results] == [1, 1]
    hit = tr.overflow[tr.overflow["overflow"]]
    assert sorted(hit["rank"]) == [0, 1] and set(hit["step"]) == {4}  # poisoned at global_steps 3


@pytest.mark.slow
def test_faults_never_reach_the_loop(job):
    root, results = job
    for res in results:
        bare, faulty, watched = res["z0_bare"], res["z0_faults"], res["z0"]
        assert faulty["losses"] == bare["losses"] == watched["losses"]  # numerics untouched
        assert faulty["scales"] == bare["scales"] and faulty["applied"] == bare["applied"]
        assert watched["status"]["errors"] == {}
        errors = faulty["status"]["errors"]
        assert set(errors) == set(FAULTS) and min(errors.values()) >= STEPS
    tr = diag.load(f"{root}/z0_faults")
    assert tr.overflow.empty and tr.memory.empty
    assert len(tr.steps) == STEPS * len(results)  # one collector failing leaves the others working


@pytest.mark.slow
def test_bf16_nonfinite_loss_and_grad_norm(job):
    root, _ = job
    ov = diag.load(f"{root}/bf16").overflow
    got = sorted(zip(ov["rank"], ov["step"], ov["source"]))
    # rank 0's loss was inf; the all-reduced gradient (and so its norm) is non-finite on both
    assert got == [(0, 4, "nonfinite_grad_norm"), (0, 4, "nonfinite_loss"), (1, 4, "nonfinite_grad_norm")]
    assert ov["scale_before"].isna().all()
