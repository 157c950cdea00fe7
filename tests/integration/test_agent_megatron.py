"""The agent inside a real megatron-core GPTModel with tensor parallel size 2 (CPU, gloo)."""

from __future__ import annotations

import pytest

from tests.integration import truth
from tests.integration.runs import MEGATRON, Job, Runs

pytestmark = pytest.mark.slow

STEPS = 3
ARGS = ["--steps", str(STEPS), "--layers-every", "1", "--truth"]
TP = 2


@pytest.fixture(scope="module")
def pair(runs: Runs) -> tuple[Job, Job]:
    return runs.get(MEGATRON, ARGS, diag=True), runs.get(MEGATRON, ARGS, diag=False)


def test_losses_bit_identical_with_agent(pair: tuple[Job, Job]) -> None:
    on, off = pair
    assert [on.rank(r)["losses"] for r in range(2)] == [off.rank(r)["losses"] for r in range(2)]


def test_all_reduce_count_matches_profiler(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    for r in range(2):
        counts, _ = truth.agent_comms(on.trace.comms, r)
        assert counts == truth.profiler_counts(on.rank(r))


def test_thirteen_all_reduces_per_step_with_their_sizes(pair: tuple[Job, Job]) -> None:
    """Per forward+backward (L=2): 2 per layer forward (attention and MLP row-parallel outputs) + 1
    embedding + 1 per column-parallel input in backward (qkv, fc1 per layer, output layer) + 3 in the
    vocab-parallel cross entropy ([s, b] each): 4 + 1 + 5 + 3 = 13 (DESIGN.md measured 13)."""
    on, _ = pair
    m = on.result["model"]
    sbh = m["seq"] * m["batch"] * m["hidden"] * 4
    sb = m["seq"] * m["batch"] * 4
    comms = on.trace.comms
    for r in range(2):
        per_step = comms[comms["rank"] == r].groupby("step")
        assert per_step.size().to_dict() == dict.fromkeys(range(STEPS), 13)
        assert per_step["bytes"].sum().to_dict() == dict.fromkeys(range(STEPS), 10 * sbh + 3 * sb)
        assert set(comms[comms["rank"] == r]["group_size"]) == {TP}


def test_tensor_parallel_linear_flops_are_exact(pair: tuple[Job, Job]) -> None:
    """A column-parallel linear holds out/TP rows: 2*M*K*(N/TP) forward, twice that backward."""
    on, _ = pair
    m = on.result["model"]
    tokens, h = m["batch"] * m["seq"], m["hidden"]
    shapes = {
        "decoder.layers.0.self_attention.linear_qkv": (h, 3 * h // TP),
        "decoder.layers.1.mlp.linear_fc1": (h, 4 * h // TP),
        "decoder.layers.1.mlp.linear_fc2": (4 * h // TP, h),
    }
    for r in range(2):
        for name, (k, n) in shapes.items():
            fwd = truth.layer_rows(on.trace.layers, r, name, "fwd")
            bwd = truth.layer_rows(on.trace.layers, r, name, "bwd")
            assert truth.per_step(fwd, "flops") == dict.fromkeys(range(STEPS), 2 * tokens * k * n)
            assert truth.per_step(bwd, "flops") == dict.fromkeys(range(STEPS), 4 * tokens * k * n)


def test_throughput_counts_each_ranks_tensor_parallel_share(pair: tuple[Job, Job]) -> None:
    """Per rank and step: 1/TP of the model's matmuls (QKV, projection, MLP, the core attention's
    QK^T and AV over heads/TP, the vocab-parallel logits), forward once and backward twice."""
    from diag.report import model as report

    on, _ = pair
    m = on.result["model"]
    b, s, h, v, layers = m["batch"], m["seq"], m["hidden"], m["vocab"], m["layers"]
    fwd = (layers * (24 * b * s * h * h + 4 * b * s * s * h) + 2 * b * s * h * v) // TP
    rows = report.build(on.trace, [], {})["throughput"]["per_step"]
    assert sorted((r["rank"], r["step"]) for r in rows if r["flops"] == 3 * fwd) == [
        (r, st) for r in range(2) for st in range(1, STEPS)
    ]  # step 0 has no duration


def test_healthy_agent_reports_no_errors(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    assert on.trace.errors.empty, on.trace.errors.to_dict("records")
    assert not on.trace.problems


def test_tensor_parallel_layout_recorded(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    assert on.trace.layout().get("tp") == TP


def test_module_tree_nests_and_adds_up(pair: tuple[Job, Job]) -> None:
    """Issue 9: parents' windows and FLOPs on a real megatron-core model: every window within its
    parent's, siblings disjoint, a parent's FLOPs its children's plus its own ops. Megatron's only
    parent with ops of its own is core_attention (baddbmm + bmm: 2 * 2*b*(heads/TP)*s*s*d)."""
    on, _ = pair
    m = on.result["model"]
    attn = 4 * m["batch"] * (m["heads"] // TP) * m["seq"] ** 2 * (m["hidden"] // m["heads"])
    layers = on.trace.layers
    for r in range(2):
        recs = layers[layers["rank"] == r].to_dict("records")
        for phase, own in (("fwd", attn), ("bwd", 2 * attn)):
            mine = [x for x in recs if x["phase"] == phase]
            assert {x["module"] for x in mine} >= {"GPTModel", "output_layer", "decoder.layers.1"}
            assert truth.module_tree_problems(mine, {"core_attention": own}) == []


def test_groups_named_by_their_megatron_role(pair: tuple[Job, Job]) -> None:
    """Issue 9: groups showed as bare c10d ids ("0", "5"); the layout had no groups."""
    on, _ = pair
    comms = on.trace.comms
    assert {str(g).split(":")[0] for g in comms["group"]} == {"tp"}
    groups = on.trace.layout()["groups"]
    tp = {name: g for name, g in groups.items() if g["role"] == "tp"}
    assert [(g["size"], g["ranks"]) for g in tp.values()] == [(TP, [0, 1])]
    assert set(map(str, comms["group"])) == set(tp)


def test_every_collective_carries_its_module(runs: Runs) -> None:
    """Issue 9: collectives named their module on 1 step in 10 only (module tracking runs on the
    first 10 steps and every 10th). Steps 11 and 12 are untracked: each collective takes its match's
    module in step 10, the same as tracking finds for them (megatron's 13 all_reduces a step)."""
    job = runs.get(MEGATRON, ["--steps", "13"], diag=True)
    comms = job.trace.comms
    for r in range(2):
        mine = comms[comms["rank"] == r].sort_values("ts")
        per_step = {s: list(g["module"]) for s, g in mine.groupby("step")}
        assert len(per_step[10]) == 13 and all(per_step[10])
        assert per_step[11] == per_step[12] == per_step[10]
        assert mine["module"].notna().all()
