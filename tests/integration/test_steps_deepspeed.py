"""Step boundaries from a real 2-rank DeepSpeed job (gloo, forked ranks: tests/integration/ds_harness.py)
with the agent attached mid-run."""

from __future__ import annotations

import math
from typing import Any

import pytest

import diag
from tests.integration.ds_harness import WORLD, ds_config, run_ranks, train


def _attach_midrun(rank: int, trace: str) -> dict[str, Any]:
    return train(rank, ds_config(stage=1, gas=2), 8, trace=trace, attach_at=3, what=("steps", "memory"))


@pytest.mark.slow
def test_deepspeed_steps_attached_midrun_number_like_the_job(tmp_path):
    trace = str(tmp_path / "trace")
    results = run_ranks(tmp_path, _attach_midrun, trace)
    tr = diag.load(trace)
    assert sorted(tr.headers) == [0, 1]
    for rank, res in enumerate(results):
        steps = tr.steps[tr.steps["rank"] == rank].sort_values("step")
        first = int(steps["step"].iloc[0])
        assert 4 <= first <= 6, first  # attached at global_steps 3 (step 4 running), installed by 6
        # one record per optimizer step (not per micro step, not twice), numbered like the engine:
        # its global_steps once the step is taken (DeepSpeed's `step=N`), the last one = global_steps
        assert list(steps["step"]) == list(range(first, res["global_steps"] + 1))
        assert (steps["samples"] == 2 * 2 * WORLD).all()  # micro batch x grad accum x dp
        assert steps["applied"].all()
        durs = list(steps["dur"])
        assert math.isnan(durs[0]) or durs[0] is None  # the first step seen has no start
        assert all(d > 0 for d in durs[1:])
        assert tr.headers[rank]["zero_stage"] == 1 and tr.headers[rank]["gradient_accumulation_steps"] == 2
        mem = tr.memory[tr.memory["rank"] == rank]
        assert list(mem["step"]) == list(steps["step"])
        assert (mem["rss"] > 10 * 2**20).all() and (mem["device"] == "cpu").all()
        assert res["status"]["errors"] == {}


def _attach_inside_a_step(rank: int, trace: str) -> dict[str, Any]:
    """The agent starts after the first step's forward and before its backward (an attach that lands
    inside a step): the backward's gradient all-reduce belongs to that step."""
    import deepspeed
    import torch

    from diag import agent

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config())
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(3):
        loss = engine(torch.randn(2, 8, generator=gen)).pow(2).mean()
        if step == 0:
            agent.start(trace, what="steps,comms")
        engine.backward(loss)
        engine.step()
    return {"global_steps": int(engine.global_steps)}


@pytest.mark.slow
def test_an_attach_inside_a_step_numbers_that_steps_collectives(tmp_path):
    """Megatron-DeepSpeed attached mid-step recorded the step's collectives as step 0 (issue 9)."""
    trace = str(tmp_path / "trace")
    results = run_ranks(tmp_path, _attach_inside_a_step, trace)
    tr = diag.load(trace)
    for rank, res in enumerate(results):
        steps = sorted(tr.steps[tr.steps["rank"] == rank]["step"])
        comms = tr.comms[tr.comms["rank"] == rank]
        assert steps == [1, 2, 3] == list(range(1, res["global_steps"] + 1)), steps
        assert not comms.empty and set(comms["step"]) <= set(steps), sorted(set(comms["step"]))
        assert (comms["step"] == 1).any()  # the first step's all-reduce, issued after the attach
