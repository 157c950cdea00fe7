"""A real megatron-core MoE job (4 experts, top-2, EP=2, alltoall dispatcher; 2 ranks on CPU/gloo)
under the agent: its collectives land on the groups megatron-core calls them on, named for their
role, in the counts its MoE layer issues; each expert's linear layers count 2 x M x N x K with the
tokens the router really sent it; and no rule fires on the healthy run."""

from __future__ import annotations

import json

import pytest
from diag.analyzers import run_all

import diag
from diag.trace.model import Trace
from tests.workloads import launch

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

STEPS, LAYERS, HIDDEN = 3, 2, 64


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Trace]:
    tmp = tmp_path_factory.mktemp("moe")
    out, trace = str(tmp / "result.json"), str(tmp / "trace")
    args = ["--steps", str(STEPS), "--layers", str(LAYERS), "--hidden", str(HIDDEN), "--layers-every", "1"]
    launch.run("tests.workloads.megatron_moe", [*args, "--out", out, "--diag", "--trace-dir", trace])
    with open(out) as f:
        return json.load(f), diag.load(trace)


def test_dispatcher_collectives_are_on_named_groups_in_megatrons_counts(job) -> None:
    """Per step and MoE layer the alltoall dispatcher issues 3 all_to_alls forward (tokens, probs,
    combine) and 3 backward on `ep`, and one tokens-per-expert all_gather on `tp_ep`, a group of its
    own that showed as a bare c10d id before diag knew it."""
    _, tr = job
    c = tr.comms[tr.comms["step"] < STEPS]
    for rank in (0, 1):
        mine = c[c["rank"] == rank]
        per_role = mine.groupby([mine["op"], mine["group"].str.split(":").str[0]]).size().to_dict()
        assert per_role[("all_to_all", "ep")] == 6 * LAYERS * STEPS
        assert per_role[("all_gather", "tp_ep")] == LAYERS * STEPS
        assert all(":" in g for g in mine["group"]), sorted(set(mine["group"]))
    assert tr.layout()["ep"] == 2


def test_expert_flops_count_the_tokens_each_expert_got(job) -> None:
    """At the default `flops_every` (4) too: a model with experts counts every sample, since its
    routing changes each expert's rows every step (reused FLOPs were up to 6% off)."""
    result, tr = job
    ffn = 4 * HIDDEN
    fc1 = tr.layers[tr.layers["module"].str.endswith("linear_fc1") & (tr.layers["phase"] == "fwd")]
    checked = 0
    for rank in (0, 1):
        for name, rows in result["ranks"][rank]["expert_rows"].items():
            got = fc1[(fc1["rank"] == rank) & (fc1["module"] == name)].set_index("step")["flops"]
            for step, flops in got.items():
                assert flops == 2 * rows[step] * HIDDEN * ffn, (rank, name, step)
                checked += 1
    assert checked == 2 * 2 * LAYERS * STEPS  # 2 local experts per layer on each rank, every step
    per_rank = [
        sum(result["ranks"][r]["expert_rows"][n][0] for n in result["ranks"][r]["expert_rows"])
        for r in (0, 1)
    ]
    assert sum(per_rank) == 2 * 4 * 32 * 2 * LAYERS  # top-2 of every token (2 ranks x batch 4 x seq 32)


def test_healthy_moe_run_has_no_finding(job) -> None:
    findings, failures = run_all(job[1])
    assert failures == {} and [f.rule for f in findings] == []


def test_allgather_dispatcher_job_has_its_expert_parallel_degree(tmp_path) -> None:
    """The allgather dispatcher moves tokens on `tp_ep` only, so no collective ever runs on `ep`,
    whose first call is what gave the layout its EP: the header read TP=1 PP=1 DP=2 for an EP=2 job.
    megatron-core's parallel_state says it from the start."""
    trace = str(tmp_path / "trace")
    args = ["--steps", "2", "--layers", "1", "--hidden", str(HIDDEN), "--dispatcher", "allgather"]
    launch.run(
        "tests.workloads.megatron_moe",
        [*args, "--out", str(tmp_path / "r.json"), "--diag", "--trace-dir", trace],
    )
    tr = diag.load(trace)
    roles = set(tr.comms["group"].astype(str).str.split(":").str[0])
    assert "tp_ep" in roles and "ep" not in roles and "all_to_all" not in set(tr.comms["op"].astype(str))
    assert tr.layout()["ep"] == 2
    findings, failures = run_all(tr)
    assert failures == {} and [f.rule for f in findings] == []
