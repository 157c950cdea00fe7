"""`diag diff` on real sample runs: the waterfall sums exactly, a run diffed with itself is all zero,
and each scenario's change is put on its cause (ZeRO-3 gathers, the straggler's wait, input stalls,
overflow-skipped steps, TP all_reduces)."""

from __future__ import annotations

import functools
import os
from fractions import Fraction
from typing import Any

import pytest

import diag
from diag.diff import align, model, split, waterfall
from tests.unit.kineto_samples import ROOT

SAMPLES = os.path.join(ROOT, "sample_traces")
PAIRS = [
    ("healthy", "straggler"),
    ("healthy", "zero3"),
    ("healthy", "overflow_storm"),
    ("healthy", "input_stall"),
    ("healthy", "megatron_tp2"),
    ("zero3", "embedding_heavy"),
    ("embedding_heavy", "embedding_moved"),
]


@functools.cache
def trace(name: str) -> diag.Trace:
    return diag.load(os.path.join(SAMPLES, name))


@functools.cache
def doc(a: str, b: str, unit: str = "auto") -> dict[str, Any]:
    return model.build(trace(a), trace(b), unit)


def part(d: dict[str, Any], label: str) -> dict[str, Any]:
    return next(p for p in d["waterfall"]["parts"] if p["label"] == label)


@pytest.mark.parametrize("name", sorted({n for pair in PAIRS for n in pair}))
def test_every_step_split_sums_to_its_duration(name):
    s = split.split(trace(name))
    labels = waterfall.labels_of(s)
    assert len(s) > 0 and (s[labels] >= 0).all().all()
    assert (s[labels].sum(axis=1) == s["dur_ns"]).all()


@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_waterfall_parts_sum_exactly_to_the_total(a, b):
    pa, pb = split.split(trace(a)), split.split(trace(b))
    for unit, per_a, per_b in (("step", None, None), ("sample", 8.0, 4.0)):
        w = waterfall.build(pa, pb, unit, per_a, per_b)
        assert sum(w.delta.values(), Fraction(0)) == w.total != 0
        assert sum(w.candidate.parts.values(), Fraction(0)) == w.candidate.total
    d = doc(a, b)  # the document carries the exact figures too
    parts = [Fraction(p["delta_ns_exact"]) for p in d["waterfall"]["parts"]]
    assert sum(parts, Fraction(0)) == Fraction(d["waterfall"]["total_ns_exact"])
    assert d["waterfall"]["total_ms"] == pytest.approx(sum(p["delta_ms"] for p in d["waterfall"]["parts"]))


def test_a_run_diffed_with_itself_is_zero_everywhere():
    d = doc("straggler", "straggler")
    assert d["waterfall"]["total_ms"] == 0 and all(p["delta_ms"] == 0 for p in d["waterfall"]["parts"])
    assert d["headline"]["median_change_pct"] == 0 and d["headline"]["cause"] == []
    assert all(c["delta_calls"] == 0 and c["delta_bytes"] == 0 for c in d["collectives"])
    assert all(r["delta_ms"] == 0 and r["delta_flops"] == 0 for r in d["layers"])
    f = d["findings"]
    assert f["appeared"] == f["resolved"] == [] and [x["rule"] for x in f["unchanged"]] == ["straggler"]
    assert d["config"] == [] and d["memory"]["rss"]["delta"] == 0


def test_straggler_is_the_slow_ranks_idle_and_the_others_wait():
    d = doc("healthy", "straggler")
    ranks = d["by_rank"]
    # rank 1 sleeps 80 ms before each batch: its own time is idle, rank 0 waits in the all_reduce
    assert ranks["1"]["idle"] > 40 and ranks["0"]["idle"] < 5
    assert ranks["0"]["comm:all_reduce:dp-grad"] > 60
    cause = d["headline"]["cause"]
    assert cause[0].endswith("all_reduce (data-parallel gradient reduction), exposed, mostly rank 0")
    assert "idle / input wait, mostly rank 1" in cause[1]
    assert [f["rule"] for f in d["findings"]["appeared"]] == ["straggler"]


def test_zero3_shows_the_parameter_gathers():
    d = doc("healthy", "zero3")
    gathers = part(d, "comm:all_gather:zero-gather")
    assert gathers["baseline_ms"] == 0 and gathers["candidate_ms"] > 5
    assert "zero_stage" in gathers["config"]
    assert d["headline"]["cause"][0].startswith(f"+{gathers['delta_ms']:.2f} ms/step: all_gather (ZeRO-3")
    coll = {c["key"]: c for c in d["collectives"]}
    assert coll["all_gather:zero-gather"]["baseline_calls"] is None
    assert coll["all_gather:zero-gather"]["candidate_calls"] > 30  # layer-by-layer gathers
    assert {"key": "zero_stage", "baseline": 2, "candidate": 3} in [
        {k: c[k] for k in ("key", "baseline", "candidate")} for c in d["config"]
    ]


def test_moving_the_embedding_out_of_zero3_removes_its_gathers():
    """The embedding-heavy model, whose embedding and output layer are the only parameters ZeRO-3
    partitions, moved to ZeRO-2: the per-forward gathers of those 2 x 2.1M parameters go, their
    gradients are all-reduced and the updated partitions all-gathered once a step instead, and the
    embedding_comm finding is resolved. Every part named is a collective the layout change moved."""
    d = doc("embedding_heavy", "embedding_moved")
    gathers = part(d, "comm:all_gather:zero-gather")
    assert gathers["baseline_ms"] > 5 and gathers["candidate_ms"] == 0
    assert part(d, "comm:reduce_scatter:dp-grad")["candidate_ms"] == 0
    assert "zero_stage" in gathers["config"]
    coll = {c["key"]: c for c in d["collectives"]}
    assert coll["all_gather:zero-gather"]["candidate_calls"] is None
    grads = coll["all_reduce:dp-grad"]["candidate_bytes"]
    assert grads > 2 * 65536 * 32 * 4 * 0.8  # wte's and head's fp32 gradients, every step
    assert [f["rule"] for f in d["findings"]["resolved"]] == ["embedding_comm"]
    assert d["findings"]["appeared"] == []
    moved = {c.split(": ", 1)[1].split(",")[0] for c in d["headline"]["cause"]}
    assert moved and all(m.split(" ", 1)[0] in ("all_gather", "all_reduce", "reduce_scatter") for m in moved)


def test_overflow_storm_is_skipped_steps():
    d = doc("healthy", "overflow_storm")
    skipped = part(d, "skipped")
    assert skipped["baseline_ms"] == 0 and skipped["delta_ms"] > 0.5 * d["waterfall"]["total_ms"]
    assert d["headline"]["cause"][0].endswith("overflow-skipped steps")
    assert [f["rule"] for f in d["findings"]["appeared"]] == ["overflow_storm"]
    assert any(c["key"] == "ds_config.fp16.enabled" for c in d["config"])


def test_input_stall_is_idle():
    d = doc("healthy", "input_stall")
    assert 50 < part(d, "idle")["delta_ms"] < 70  # the workload sleeps 60 ms before each batch
    assert d["headline"]["cause"][0].startswith("+") and "idle / input wait" in d["headline"]["cause"][0]
    assert [f["rule"] for f in d["findings"]["appeared"]] == ["idle_between_steps"]


def test_tp_all_reduces_get_the_tp_role_and_layers_fold_wrappers():
    d = doc("healthy", "megatron_tp2")
    assert part(d, "comm:all_reduce:tp")["baseline_ms"] == 0
    assert {"tp": (1, 2)}.items() <= {c["key"]: (c["baseline"], c["candidate"]) for c in d["config"]}.items()
    assert align.fold_layer("module.blocks.0.attn") == "blocks.0.attn"
    assert align.fold_layer("DeepSpeedEngine") == align.fold_layer("module") == "(model)"
    # DeepSpeedEngine and its `module` wrap the same work: FLOPs counted once per model replica
    lay = trace("healthy").layers
    engine = lay[(lay["module"] == "DeepSpeedEngine") & (lay["phase"] == "fwd")]["flops"].iloc[0]
    row = next(r for r in d["layers"] if r["layer"] == "(model)" and r["phase"] == "fwd")
    assert row["baseline_flops"] == engine


def test_layer_times_leave_out_the_warm_up_sample():
    """As `diag analyze`'s top layers: the first step, sampled whole with its first collectives'
    set-up in it, is not a layer's time where a steady step is sampled too (healthy: steps 0 and 4)."""
    tr = trace("healthy")
    lay = tr.layers[tr.layers["module"] == "module.blocks.0.attn"]
    assert sorted(lay["step"].unique()) == [0, 4]
    row = align.layer_table(tr).set_index(["layer", "phase"]).loc[("blocks.0.attn", "fwd")]
    fwd = lay[lay["phase"] == "fwd"]
    assert row["time_ns"] == pytest.approx(fwd[fwd["step"] == 4].groupby("rank")["dur"].sum().mean())
    assert row["time_ns"] != pytest.approx(fwd.groupby(["rank", "step"])["dur"].sum().mean())


def test_a_different_batch_compares_per_sample():
    d = doc("zero3", "embedding_heavy")
    assert d["waterfall"]["unit"] == "sample" and d["headline"]["unit"] == "sample"
    assert (d["baseline"]["samples_per_step"], d["candidate"]["samples_per_step"]) == (8, 4)
    assert set(d["headline"]["per_unit"]) == {"step", "sample"}  # no tokens recorded
    per_sample = d["headline"]["per_unit"]["sample"]
    assert per_sample["candidate_ms"] == pytest.approx(d["waterfall"]["candidate_ms"])
    per_step = doc("zero3", "embedding_heavy", "step")["waterfall"]
    assert d["waterfall"]["baseline_ms"] == pytest.approx(per_step["baseline_ms"] / 8)
    assert d["waterfall"]["candidate_ms"] == pytest.approx(per_step["candidate_ms"] / 4)
    assert [f["rule"] for f in d["findings"]["appeared"]] == ["embedding_comm"]


def test_gpu_timeline_split_matches_the_temporal_breakdown():
    """On GPU-shaped Kineto traces the steps' compute and communication add up to diag's (= HTA's)
    temporal breakdown over the same kernels (all launched before the last step, which is cut)."""
    from diag.importers import load_inputs
    from diag.metrics import breakdown
    from tests.unit.kineto_samples import GPU_RANKS

    t = load_inputs(GPU_RANKS)
    s = split.split(t)
    assert split.device_timed(t, 0) and not split.device_timed(trace("healthy"), 0)
    assert "other" not in s.columns  # a gap between kernels is the device idling
    done = s[s["sampled"]].groupby("rank")
    comm = [c for c in s.columns if c.startswith("comm:")]
    want = breakdown.temporal_breakdown(t).set_index("rank")["compute_ns"]
    assert done["compute"].sum().tolist() == want.tolist()
    hidden = breakdown.comm_overlap(t).set_index("rank")
    assert done[comm].sum().sum(axis=1).tolist() == (hidden["comm_ns"] - hidden["overlap_ns"]).tolist()


def test_data_parallel_degree_leaves_out_context_and_sequence_parallel_ranks():
    """Without a `dp` in the layout it is the world over every other factor: a CP=2 or Ulysses SP=2
    job of 4 ranks has 2 model replicas, whose FLOPs a layer's per-replica figure divides by."""
    from diag.trace.model import Trace

    for extra in ({"cp": 2}, {"sp": 2}, {"cp": 2, "sp": 2}):
        headers = {r: {"rank": r, "world_size": 8, "tp": 2, "pp": 1, **extra} for r in range(8)}
        got = align.layout(Trace(headers=headers, frames={}))
        assert got["dp"] == 8 // (2 * extra.get("cp", 1) * extra.get("sp", 1)), extra
