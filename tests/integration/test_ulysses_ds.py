"""DeepSpeed-Ulysses (tests.workloads.ulysses_ds: DistributedAttention, 2 ranks, SP=2, ZeRO-1) under
the agent, against torch.profiler's `c10d::` ops in the same run and the same job without the agent.

Found on Megatron-DeepSpeed's pretrain_gpt.py with `--ds-sequence-parallel-size 2`: the all-to-alls
were right but the layout said TP=1 PP=1 DP=1 for 2 ranks (no SP), and under ZeRO-3 tiny_collectives
counted the attention's all-to-alls among the tiny collectives a ZeRO bucket would merge."""

from __future__ import annotations

import json
import os

import pytest
from diag.analyzers import run_all

import diag
from tests.integration import truth
from tests.workloads import launch

pytestmark = pytest.mark.slow

LAYERS = 4  # 4 all-to-alls per layer forward (q, k, v, out), 4 backward: 32 of 16 KiB a step
ARGS = ["--steps", "3", "--truth", "--layers", str(LAYERS)]


def _run(folder: str, *extra: str) -> dict:
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, "result.json")
    launch.run("tests.workloads.ulysses_ds", [*ARGS, *extra, "--out", out])
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, diag.Trace]:
    folder = str(tmp_path_factory.mktemp("ulysses"))
    bare = _run(os.path.join(folder, "bare"))
    trace = os.path.join(folder, "trace")
    with_diag = _run(os.path.join(folder, "diag"), "--diag", "--trace-dir", trace)
    return bare, with_diag, diag.load(trace)


def test_all_to_alls_match_the_profiler_on_the_sp_group(runs) -> None:
    _, result, trace = runs
    c = trace.comms
    a2a = c[c["op"] == "all_to_all"]
    assert set(a2a["group"].astype(str).str.split(":").str[0]) == {"sp"}
    for r in range(2):
        mine = a2a[a2a["rank"] == r]
        counted = result["ranks"][r]["truth_comms"]
        assert len(mine) == counted["counts"]["alltoall_base_"] == 3 * 8 * LAYERS
        assert int(mine["bytes"].sum()) == counted["bytes_arg1"]["alltoall_base_"]
        assert set(mine.groupby("step").size()) == {8 * LAYERS}
    counts, _ = truth.agent_comms(c, 0)
    assert counts == truth.profiler_counts(result["ranks"][0])


def test_layout_names_the_sp_degree_and_losses_are_untouched(runs) -> None:
    bare, result, trace = runs
    assert trace.layout()["sp"] == 2
    assert result["losses"] == bare["losses"]
    assert trace.errors.empty, trace.errors.to_dict("records")


def test_attention_all_to_alls_are_not_tiny_collectives_a_bucket_merges(runs) -> None:
    """32 all-to-alls of 16 KiB a step on the sp group are the attention's activations: no
    DeepSpeed bucket or persistence setting merges them (as a TP group's all-reduces)."""
    _, _, trace = runs
    findings, failures = run_all(trace)
    assert not failures and [f for f in findings if f.rule == "tiny_collectives"] == []
