"""Two layouts of one real megatron-core GPT (4 layers, CPU/gloo): tensor parallel 2, and two
pipeline stages run by megatron-core's own 1F1B schedule. The second stage numbers its layers from 0
(`decoder.layers.0` is the model's third layer); the agent records the model-wide index and
`diag diff` lines the two layouts up layer by layer."""

from __future__ import annotations

import math

import pytest

from diag import schema
from diag.diff import align, model
from tests.integration.runs import MEGATRON, Job, Runs

pytestmark = pytest.mark.slow

STEPS, LAYERS = 3, 4
COMMON = ["--steps", str(STEPS), "--layers", str(LAYERS), "--layers-every", "1"]
TP2 = [*COMMON, "--tp", "2"]
PP2 = [*COMMON, "--tp", "1", "--pp", "2", "--micro", "1"]


@pytest.fixture(scope="module")
def tp(runs: Runs) -> Job:
    return runs.get(MEGATRON, TP2)


@pytest.fixture(scope="module")
def pp(runs: Runs) -> Job:
    return runs.get(MEGATRON, PP2)


def test_pipeline_schedule_keeps_losses_bit_identical(runs: Runs, pp: Job) -> None:
    off = runs.get(MEGATRON, PP2, diag=False)
    last = pp.result["world_size"] - 1  # the last stage computes the loss
    assert pp.rank(last)["losses"] == off.rank(last)["losses"]
    assert all(math.isfinite(x) for x in pp.rank(last)["losses"])


def test_second_stage_records_its_layers_model_wide_index(pp: Job) -> None:
    headers = pp.trace.headers
    assert headers[1].get(schema.META_LAYER_NUMBERS) == {"decoder.layers.0": 2, "decoder.layers.1": 3}
    assert not headers[0].get(schema.META_LAYER_NUMBERS)  # the first stage's local indices are global
    local = set(pp.trace.layers[pp.trace.layers["rank"] == 1]["module"].astype(str))
    assert "decoder.layers.0.mlp.linear_fc1" in local and "decoder.layers.2.mlp.linear_fc1" not in local


def test_diff_matches_every_layer_across_the_layouts(tp: Job, pp: Job) -> None:
    d = model.build(tp.trace, pp.trace)
    rows = {(r["layer"], r["phase"]): r for r in d["layers"]}
    for i in range(LAYERS):
        for phase in ("fwd", "bwd"):
            row = rows[(f"decoder.layers.{i}.mlp.linear_fc1", phase)]
            # the same matmul on the same batch: TP=2's two column shards add up to the one PP copy
            assert row["baseline_flops"] == row["candidate_flops"] > 0, (i, phase, row)
    names = set(align.layer_table(pp.trace)["layer"])
    assert {f"decoder.layers.{i}" for i in range(LAYERS)} <= names
    assert not any(n.startswith(f"decoder.layers.{LAYERS}") for n in names)
    assert {"send:pp", "recv:pp"} <= {c["key"] for c in d["collectives"] if (c["candidate_calls"] or 0) > 0}
