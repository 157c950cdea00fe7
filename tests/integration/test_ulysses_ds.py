"""DeepSpeed-Ulysses (tests.workloads.ulysses_ds: DistributedAttention, 2 ranks, SP=2, ZeRO-1) under
the agent, against torch.profiler's `c10d::` ops in the same run and the same job without the agent.

Found on Megatron-DeepSpeed's pretrain_gpt.py with `--ds-sequence-parallel-size 2`: the all-to-alls
were right but the layout said TP=1 PP=1 DP=1 for 2 ranks (no SP)."""

from __future__ import annotations

import json
import os

import pytest

import diag
from tests.integration import truth
from tests.workloads import launch

pytestmark = pytest.mark.slow

ARGS = ["--steps", "3", "--truth"]
LAYERS = 2  # the workload's default: 4 all-to-alls per layer forward (q, k, v, out), 4 backward


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
