"""The agent inside real 2-rank DeepSpeed jobs (ZeRO 0-3, fp32/bf16/fp16) against ground truth taken
in the same run by torch.profiler (collective counts), DeepSpeed's comms logger (bytes), DeepSpeed's
own `skipped_steps` (overflows), the model's shapes (FLOPs), and a run without the agent (losses)."""

from __future__ import annotations

import pytest

from tests.integration import truth
from tests.integration.runs import DS_COMMON, DS_STEPS, GPT, ZERO2_FP16, Job, Runs

pytestmark = pytest.mark.slow

STEPS = DS_STEPS
# a covering set: every ZeRO stage and every dtype at least once, overflows under two stages
CONFIGS = {
    "z0-fp16": ["--zero", "0", "--dtype", "fp16", "--overflow-at", "1"],
    "z1-bf16": ["--zero", "1", "--dtype", "bf16"],
    "z2-fp16": ZERO2_FP16,
    "z3-fp32": ["--zero", "3", "--dtype", "fp32"],
}
STEP_NUMBERS = range(1, STEPS + 1)  # DeepSpeed's own numbers: global_steps once each step is taken
COMMON = DS_COMMON


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request: pytest.FixtureRequest, runs: Runs) -> tuple[Job, Job]:
    """(run with the agent, the same run without it)."""
    args = [*CONFIGS[request.param], *COMMON]
    return runs.get(GPT, args, diag=True), runs.get(GPT, args, diag=False)


def test_losses_bit_identical_with_agent(pair: tuple[Job, Job]) -> None:
    on, off = pair
    for r in range(2):
        assert on.rank(r)["losses"] == off.rank(r)["losses"]
        assert on.rank(r)["skipped_steps"] == off.rank(r)["skipped_steps"]


def test_one_step_record_per_step(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    steps = on.trace.steps
    for r in range(2):
        mine = steps[steps["rank"] == r]
        assert sorted(mine["step"]) == list(STEP_NUMBERS)
        assert int((mine["applied"] == False).sum()) == on.rank(r)["skipped_steps"]  # noqa: E712


def test_steps_and_overflows_carry_the_jobs_own_numbers(pair: tuple[Job, Job]) -> None:
    """Issue 9: diag's step N was the job's iteration N+1. Each step record carries the engine's
    `global_steps` after it (Megatron-DeepSpeed's `iteration`), each overflow a skipped one."""
    on, _ = pair
    for r in range(2):
        mine = on.rank(r)
        steps = on.trace.steps
        assert sorted(steps[steps["rank"] == r]["step"]) == mine["iterations"]
        ov = on.trace.overflow
        flagged = ov[(ov["rank"] == r) & (ov["overflow"] == True)]  # noqa: E712
        assert sorted(flagged["step"]) == mine["skipped_iterations"]
    if on.result["overflow_at"]:
        at, rank = int(on.result["overflow_at"]), on.result["overflow_rank"]
        assert on.rank(rank)["skipped_iterations"] == [at + 1]  # loop index 1 is iteration 2


def test_groups_named_by_their_role(pair: tuple[Job, Job]) -> None:
    """Issue 9: groups showed as bare c10d ids; here every collective is on the world (= DP) group."""
    on, _ = pair
    names = set(map(str, on.trace.comms["group"]))
    assert names and all(n.split(":")[0] in ("world", "dp") for n in names), names
    groups = on.trace.layout()["groups"]
    assert names <= set(groups) and all(groups[n]["ranks"] == [0, 1] for n in names)


def test_collective_counts_match_profiler(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    for r in range(2):
        counts, _ = truth.agent_comms(on.trace.comms, r)
        assert counts == truth.profiler_counts(on.rank(r))


def test_collective_bytes_match_comms_logger(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    for r in range(2):
        # the logger sees only deepspeed.comm; it must have seen every collective for this to hold
        assert truth.ds_counts(on.rank(r)) == truth.profiler_counts(on.rank(r))
        _, nbytes = truth.agent_comms(on.trace.comms, r)
        expected = truth.ds_bytes(on.rank(r), on.result["world_size"])
        assert {k: v for k, v in nbytes.items() if k != "barrier"} == {
            k: v for k, v in expected.items() if k != "barrier"
        }


def test_all_gather_bytes_match_profiler_shapes(pair: tuple[Job, Job]) -> None:
    """A second, independent source for the sized ops: the profiler's recorded tensor shapes."""
    on, _ = pair
    for r in range(2):
        _, nbytes = truth.agent_comms(on.trace.comms, r)
        prof = on.rank(r)["truth_comms"]
        if "_allgather_base_" in prof["bytes"]:  # (output, input): the output is the whole buffer
            assert nbytes["all_gather"] == prof["bytes"]["_allgather_base_"]
        if "_reduce_scatter_base_" in prof["bytes"]:  # (output, input): the input is
            assert nbytes["reduce_scatter"] == prof["bytes_arg1"]["_reduce_scatter_base_"]


def test_overflow_events_equal_skipped_steps(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    ov = on.trace.overflow
    for r in range(2):
        flagged = ov[(ov["rank"] == r) & (ov["overflow"] == True)]  # noqa: E712
        assert len(flagged) == on.rank(r)["skipped_steps"]
    if on.result["dtype"] == "fp16":
        assert on.rank(0)["skipped_steps"] == 1, "the forced inf must cause exactly one overflow"
        scales = ov[(ov["rank"] == 0) & (ov["overflow"] == True)]  # noqa: E712
        assert list(scales["scale_before"]) == [256.0] and list(scales["scale_after"]) == [128.0]


def test_linear_flops_are_exact(pair: tuple[Job, Job]) -> None:
    """2*M*N*K forward; backward = input grad + weight grad = 4*M*N*K (every linear here needs both)."""
    on, _ = pair
    m = on.result["model"]
    tokens, h, v = m["batch"] * m["seq"], m["hidden"], m["vocab"]
    shapes = {
        "blocks.0.attn.qkv": (h, 3 * h),
        "blocks.1.mlp.fc1": (h, 4 * h),
        "blocks.1.mlp.fc2": (4 * h, h),
        "head": (h, v),
    }
    layers = on.trace.layers
    for r in range(2):
        for name, (k, n) in shapes.items():
            fwd = truth.layer_rows(layers, r, name, "fwd")
            bwd = truth.layer_rows(layers, r, name, "bwd")
            assert truth.per_step(fwd, "flops") == dict.fromkeys(STEP_NUMBERS, 2 * tokens * k * n)
            assert truth.per_step(bwd, "flops") == dict.fromkeys(STEP_NUMBERS, 4 * tokens * k * n)


def test_throughput_is_the_models_flops_over_step_time(pair: tuple[Job, Job]) -> None:
    """`diag analyze`'s FLOPs per step and rank are the model's: forward 2*M*N*K of every linear plus
    SDPA's QK^T and AV; backward twice that plus the score matrix SDPA's backward recomputes. TFLOP/s
    is that over the step's own time, samples/s the rank's replica's share of the engine's samples
    (the global batch over dp: 2 ranks, micro-batch b each) over it."""
    from diag.report import model as report

    on, _ = pair
    m = on.result["model"]
    b, s, h, v, layers = m["batch"], m["seq"], m["hidden"], m["vocab"], m["layers"]
    fwd = layers * (2 * b * s * 12 * h * h + 4 * b * s * s * h) + 2 * b * s * h * v
    want = 3 * fwd + layers * 2 * b * s * s * h
    tp = report.build(on.trace, [], {})["throughput"]
    rows = [r for r in tp["per_step"] if r["step"] in STEP_NUMBERS]
    assert len(rows) == 2 * (STEPS - 1) and all(r["sampled"] for r in rows)  # the first has no duration
    for r in rows:
        assert r["flops"] == want
        assert r["tflops"] == pytest.approx(want / r["dur_ns"] / 1e3)
        assert r["samples_per_s"] == pytest.approx(b / (r["dur_ns"] / 1e9))
    assert tp["peak"] is None and "CPU" in tp["peak_note"]


def test_memory_sampled_every_step(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    mem = on.trace.memory
    for r in range(2):
        mine = mem[mem["rank"] == r]
        assert set(STEP_NUMBERS) <= set(mine["step"])
        assert (mine["rss"].dropna() > 0).all()


def test_healthy_agent_reports_no_errors_or_drops(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    assert on.trace.errors.empty, on.trace.errors.to_dict("records")
    assert not on.trace.problems
    last = on.trace.stats.groupby("rank").tail(1)
    assert all(not d for d in last["dropped"]), last["dropped"].tolist()
