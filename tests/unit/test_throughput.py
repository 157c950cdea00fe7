"""TFLOP/s, MFU, samples/s and tokens/s: the measured count from layer records, the peak table, and
Megatron's analytic formulas checked against a real Megatron-DeepSpeed log's own TFLOPs lines."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.cli import main
from diag.importers.logs import import_log
from diag.metrics import model_flops, peaks, positions, throughput
from diag.metrics.stage import Metrics
from diag.report import model as report_model
from tests.unit.synth_trace import MS, Job

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logs")
MDS_LOG = os.path.join(FIX, "megatron_deepspeed_tflops.log")


# -- the peak table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,dtype,want",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "fp16", 756.0),
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA H200", "fp8", 1979.0),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA A100-SXM4-80GB", "fp32", 156.0),
        ("NVIDIA A100 80GB PCIe", "bf16", 312.0),
        ("AMD Instinct MI300X", "fp8", 2614.9),
    ],
)
def test_dense_peaks_by_device_name_and_dtype(name, dtype, want):
    p = peaks.lookup(name, dtype)
    assert p is not None and p.tflops == want and p.source


def test_no_peak_for_cpu_unknown_gpu_or_dtype():
    assert peaks.lookup("cpu", "bf16") is None and "CPU" in peaks.unknown_reason("cpu", "bf16")
    assert peaks.lookup("NVIDIA A100-SXM4-40GB", "fp8") is None  # Ampere has no FP8 tensor cores
    assert peaks.lookup("NVIDIA L4", "bf16") is None
    assert "--peak-tflops" in peaks.unknown_reason("NVIDIA L4", "bf16")
    assert peaks.lookup("NVIDIA H100 80GB HBM3", None) is None


# -- Megatron's formulas ----------------------------------------------------------------------------

SHAPE = {
    "num_layers": 2,
    "hidden_size": 512,
    "ffn_hidden_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "seq_length": 512,
    "padded_vocab_size": 1024,
    "topk": 1,
}


def test_megatron_deepspeed_formula_by_hand():
    # MACs per sample: QKV+out 4*h*h*s*L, scores+context 2*h*s*s*L, MLP 2*ffn*h*s*L, logits V*h*s
    h, s, layers, v, ffn = 512, 512, 2, 1024, 2048
    fwd = 4 * h * h * s * layers + 2 * h * s * s * layers + 2 * ffn * h * s * layers + v * h * s
    assert model_flops.megatron_deepspeed(SHAPE, 1) == 2 * 3 * fwd
    assert model_flops.megatron_deepspeed({**SHAPE, "checkpoint_activations": True}, 1) == 2 * 4 * fwd
    assert model_flops.megatron_deepspeed({**SHAPE, "recompute_granularity": "selective"}, 1) == 2 * (
        3 * fwd + 2 * h * s * s * layers
    )
    # its integer `2 // gqa`: K and V projections vanish from the count at 4 query heads per KV head
    gqa4 = model_flops.megatron_deepspeed({**SHAPE, "num_key_value_heads": 2}, 1)
    assert gqa4 == 2 * 3 * (fwd - 2 * h * h * s * layers)


def test_megatron_lm_formula_by_hand():
    h, s, layers, v, ffn = 512, 512, 2, 1024, 2048
    lm = {k: val for k, val in SHAPE.items() if k not in ("num_key_value_heads", "topk")}
    per_token = 6 * (2 * h * ffn * layers + layers * 4 * h * h + h * v)
    causal_core = 6 * h * layers * s * s  # 3 x 2 x (QK^T + AV) over half the s x s scores
    assert model_flops.megatron_lm(lm, 4) == 4 * (s * per_token + causal_core)
    gqa = {**lm, "group_query_attention": True, "num_query_groups": 2, "swiglu": True}
    kv = 2 * (h // 8)
    per_token = 6 * (3 * h * ffn * layers + layers * (h * (h + 2 * kv) + h * h) + h * v)
    assert model_flops.megatron_lm(gqa, 1) == s * per_token + causal_core
    assert model_flops.formula_of(lm) == "megatron-lm"
    assert model_flops.formula_of(SHAPE) == "megatron-deepspeed"


def test_megatron_lm_moe_counts_routed_shared_and_dense_layers_as_megatron_lm_does():
    """Megatron-LM's `num_floating_point_operations` (d98e8a6): MoE layers by `moe_layer_freq`,
    each with `moe_router_topk` experts of `moe_ffn_hidden_size` plus the shared expert; the other
    layers dense with `ffn_hidden_size`. The shape of run_simple_mcore_train_loop.py made MoE
    (4 experts, top-2, batch 16): diag's counted FLOPs of that run were this + the full (not
    causal) s x s attention 9,437,184 + the router GEMMs 589,824 = 62,226,432, to the FLOP."""
    h, s, layers, v = 12, 64, 2, 100
    moe = {"num_layers": layers, "hidden_size": h, "ffn_hidden_size": 48, "num_attention_heads": 4}
    moe |= {"seq_length": s, "padded_vocab_size": v, "num_experts": 4, "moe_router_topk": 2}
    attn, logits, core = layers * 4 * h * h, h * v, 6 * h * layers * s * s
    per_token = 6 * (2 * h * 48 * 2 * layers + attn + logits)
    assert model_flops.megatron_lm(moe, 16) == 16 * (s * per_token + core) == 52_199_424
    # DeepSeek-style: first layer dense (its own ffn), the second MoE with a shared expert
    ds = {**moe, "num_layers": 2, "moe_layer_freq": [0, 1], "moe_ffn_hidden_size": 8}
    ds |= {"moe_shared_expert_intermediate_size": 16, "swiglu": True}
    mlp = 3 * h * (48 * 1 + (8 * 2 + 16) * 1)
    assert model_flops.megatron_lm(ds, 1) == s * 6 * (mlp + attn + logits) + core
    # an int frequency: every 2nd layer from the first is MoE (layers 0 and 2 of 3)
    every2 = {**moe, "num_layers": 3, "moe_layer_freq": 2}
    mlp = 2 * h * (48 * 1 + 48 * 2 * 2)
    assert model_flops.megatron_lm(every2, 1) == s * 6 * (mlp + 3 * 4 * h * h + logits) + 6 * h * 3 * s * s


def test_model_view_agrees_with_megatron_deepspeeds_own_tflops_lines():
    """A real Megatron-DeepSpeed log: its arguments dump gives the shape, and the formula on each
    iteration's printed time gives the TFLOPs it printed (2 decimals) on every line."""
    res = import_log(MDS_LOG)
    shape = res.headers[0]["model"]
    assert shape["padded_vocab_size"] == 1024 and shape["num_layers"] == 2 and shape["seq_length"] == 512
    flops, formula = model_flops.iteration_flops(shape)
    assert formula == "megatron-deepspeed" and flops == 24_159_191_040
    st = res.frames["log_step"].dropna(subset=["tflops"])
    assert len(st) == 12 and st["tflops"].max() >= 0.03  # a line a wrong factor would misprint
    for ms, printed in zip(st["iter_ms"], st["tflops"]):
        assert round(flops / (ms / 1e3 * shape["world_size"]) / 1e12, 2) == printed


def test_model_option_spellings_and_errors():
    m = model_flops.from_options("layers=2,hidden=512,seq=512,vocab=1024,heads=8,batch=4,swiglu=true")
    assert m["num_layers"] == 2 and m["global_batch_size"] == 4 and m["swiglu"] is True
    with pytest.raises(ValueError, match="missing hidden_size"):
        model_flops.from_options("layers=2")
    with pytest.raises(ValueError, match="not a number"):
        model_flops.from_options("layers=two,hidden=1,seq=1,vocab=1")


# -- the measured count -----------------------------------------------------------------------------


def _layer(job, rank, step, module, phase, at_ms, dur_ms, flops):
    job.add(
        rank,
        "layer",
        step=step,
        module=module,
        phase=phase,
        ts=job.start(rank, step) + int(at_ms * MS),
        dur=int(dur_ms * MS),
        flops=flops,
    )


def _model_step(job, rank, step, recompute=0):
    """Root forward 10 (children inclusive), root backward 20 with a recomputed forward inside."""
    _layer(job, rank, step, "GPTModel", "fwd", 1, 30, 10)
    _layer(job, rank, step, "GPTModel.layers.0", "fwd", 1, 10, 4)
    _layer(job, rank, step, "GPTModel", "bwd", 40, 50, 20 + recompute)
    if recompute:
        _layer(job, rank, step, "GPTModel.layers.0", "fwd", 45, 5, recompute)  # inside backward


def test_step_flops_sum_outermost_records_once(tmp_path):
    job = Job(ranks=1, steps=4)
    _model_step(job, 0, 0, recompute=4)
    _model_step(job, 0, 2)
    _model_step(job, 0, 2)  # a second micro-batch of the same step (same times: nested -> once)
    _layer(job, 0, 2, "GPTModel", "fwd", 92, 2, 10)  # a third, after the others
    job.add(0, "layer", step=3, module="GPTModel", phase="fwd", ts=job.start(0, 3), dur=MS, flops=None)
    got = throughput.step_flops(job.write(str(tmp_path)).layers).set_index("step")["flops"]
    assert got[0] == 34 and got[2] == 40 and got.isna()[3]


def test_per_step_holds_flops_and_per_rank_skips_sampled_steps(tmp_path, monkeypatch):
    job = Job(ranks=2, steps=8, step_ms=100.0)
    for r in range(2):
        for s in (0, 4):
            _model_step(job, r, s)
    tr = job.write(str(tmp_path), step_ms={0: 100.0, 1: 200.0})
    counted = throughput.step_flops(tr.layers)
    monkeypatch.setattr(positions, "CHUNK_ROWS", 1)  # a chunk a rank: the same as both at once
    pd.testing.assert_frame_equal(throughput.step_flops(tr.layers), counted, check_exact=True)
    rows = throughput.per_step(Metrics(tr).steps, tr.layers, peak_tflops=1e-9, seq_length=64, dp=2)
    assert rows["flops"].eq(30).all() and list(rows[rows["rank"] == 0]["sampled"]) == [
        True,
        False,
        False,
        False,
        True,
        False,
        False,
        False,
    ]
    r0 = rows[(rows["rank"] == 0) & (rows["step"] == 1)].iloc[0]
    assert r0["tflops"] == pytest.approx(30 / 0.1 / 1e12) and r0["mfu"] == pytest.approx(0.3)
    # the step's 8 samples are the job's (global batch): a rank's replica does 8 / dp of them
    assert r0["samples_per_s"] == pytest.approx(40) and r0["tokens_per_s"] == pytest.approx(40 * 64)
    short = rows[(rows["rank"] == 1) & (rows["step"] < 2)].assign(rank=2)  # too few to skip one
    unsampled = rows[rows["rank"] == 0].assign(rank=3, sampled=False)
    ranks = throughput.per_rank(pd.concat([rows, short, unsampled])).set_index("rank")
    assert ranks.loc[0, "steps"] == 6  # steady (no warm-up step 0) and not sampled: 1, 2, 3, 5, 6, 7
    assert list(ranks.loc[[2, 3], "steps"]) == [1, 7]  # each rank's own warm-up skipped (if 3 steps)
    assert ranks.loc[1, "step_ms"] == pytest.approx(200)
    assert throughput.job_step_s(rows) == pytest.approx(0.2)  # the slowest rank sets the pace


def test_report_document_and_peak_option(tmp_path, capsys):
    job = Job(
        ranks=2, steps=8, header={"zero_stage": 0, "dtype": "bf16", "device_name": "NVIDIA H100 80GB HBM3"}
    )
    for r in range(2):
        for s in (0, 4):
            _model_step(job, r, s)
    tr = job.write(str(tmp_path / "t"))
    doc = report_model.build(tr, [], {})
    tp = doc["throughput"]
    assert tp["peak"]["tflops"] == 989.4 and tp["peak"]["dtype"] == "bf16"
    want = 30 / 0.1 / 1e12
    assert tp["measured"]["tflops_per_gpu"] == pytest.approx(want)
    assert doc["summary"]["tflops_median"] == pytest.approx(want) and doc["summary"]["mfu"] == pytest.approx(
        want / 989.4
    )
    assert main(["analyze", str(tmp_path / "t"), "--json", "--peak-tflops", "2e-12"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["throughput"]["peak"]["source"] == "--peak-tflops"
    assert out["summary"]["mfu"] == pytest.approx(want / 2e-12)
    # how it was counted names the views shown: no model shape, no Megatron formula
    assert (
        tp["model"] is None
        and tp["counted"].startswith("measured: FLOPs counted")
        and "Megatron" not in tp["counted"]
    )
    shape = "layers=2,hidden=64,seq=64,vocab=1024,heads=4,batch=8"
    assert main(["analyze", str(tmp_path / "t"), "--json", "--model", shape]) == 0
    both = json.loads(capsys.readouterr().out)["throughput"]
    assert both["model"] is not None and both["counted"].startswith(
        tp["counted"] + " model: Megatron's analytic"
    )


def test_cpu_trace_says_no_peak_and_bad_options_are_one_line(tmp_path, capsys):
    tr_dir = os.path.join(os.path.dirname(__file__), "..", "..", "sample_traces", "healthy")
    assert main(["analyze", tr_dir]) == 0
    out = capsys.readouterr().out
    assert "no peak is known for a CPU" in out and "GFLOP/s per rank" in out
    assert main(["analyze", tr_dir, "--peak-tflops", "0"]) == 2
    assert main(["analyze", tr_dir, "--model", "layers=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--peak-tflops must be" in err[0] and "--model: missing" in err[1]


def test_a_log_printing_tflops_0_00_is_not_headlined_as_zero(capsys):
    """Megatron-DeepSpeed prints TFLOPs with 2 decimals: a tiny CPU job prints 0.00 on most lines
    (the real pretrain_gpt.py run's report said "0 FLOP/s per GPU"). The headline is the model view on
    the log's own iteration times; a printed 0.00 alone is no headline at all."""
    log = import_log(MDS_LOG).frames["log_step"]
    assert (log["tflops"] == 0.0).any()  # the premise: the log does print 0.00 lines
    assert main(["analyze", MDS_LOG, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["tflops_source"] == "model on the log's times" and s["tflops_median"] > 0.005
    zero = {"measured": {"tflops_per_gpu": None, "mfu": None}, "model": None}
    assert report_model._headline(zero, log.assign(tflops=0.0)) == (None, None, None)


def _per_rank_copied(rows: pd.DataFrame) -> pd.DataFrame:
    """`per_rank` as it was made before it read one column at a time (masks by a sort, a copy of
    every column the medians read)."""
    pos = rows[["rank", "step"]].reset_index(drop=True)
    by = pos.groupby("rank")["step"]
    nth = pos.sort_values(["rank", "step"], kind="stable").groupby("rank").cumcount().sort_index()
    first = pos["step"].where(nth == 1).groupby(pos["rank"]).transform("max")
    kept = ((by.transform("size") <= 2) | (pos["step"] >= first)).to_numpy()
    unsampled = (~rows["sampled"]).to_numpy()
    some = pd.Series(kept & unsampled).groupby(pos["rank"]).transform("any").to_numpy()
    medians = ("tflops", "mfu", "samples_per_s", "tokens_per_s")
    quiet = rows.loc[kept & (unsampled | ~some), ["rank", "flops", "dur_ns", *medians]]
    g = quiet.groupby("rank")
    out = pd.DataFrame(
        {
            "steps": g.size(),
            "flops_per_step": g["flops"].median(),
            "step_ms": g["dur_ns"].median() / 1e6,
            **{col: g[col].median() for col in medians},
        }
    ).reindex(by.size().index)
    out["steps"] = out["steps"].fillna(0).astype("int64")
    return out.rename_axis("rank").reset_index()[throughput.RANK_COLUMNS]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # rank
            st.integers(0, 6),  # step
            st.booleans(),  # sampled
            st.one_of(st.just(float("nan")), st.floats(1, 1e3)),  # flops
            st.integers(1, 10**9),  # dur_ns
        ),
        min_size=1,
        max_size=40,
        unique_by=lambda row: row[:2],
    ),
    st.booleans(),
)
def test_per_rank_gives_what_the_copying_version_gave(rows, in_order):
    """In (rank, step) order (a step frame's rows, told by position) or in any order."""
    df = pd.DataFrame(rows, columns=["rank", "step", "sampled", "flops", "dur_ns"])
    if in_order:
        df = df.sort_values(["rank", "step"], ignore_index=True)
    df["tflops"] = df["flops"] / (df["dur_ns"] / 1e9) / 1e12
    df["mfu"] = df["tflops"] / 100
    df["samples_per_s"] = 8 / (df["dur_ns"] / 1e9)
    df["tokens_per_s"] = float("nan")
    pd.testing.assert_frame_equal(throughput.per_rank(df), _per_rank_copied(df))


def _held_flops_merged(steps: pd.DataFrame, counted: pd.DataFrame) -> pd.DataFrame:
    """`_held_flops` as it was made before it searched each rank's samples (three merges over the
    union of the two frames' keys)."""
    out = steps.merge(counted, on=["rank", "step"], how="left")
    out["sampled"] = out["flops"].notna()
    every = pd.concat([out[["rank", "step"]], counted[["rank", "step"]]]).drop_duplicates()
    every = every.merge(counted, on=["rank", "step"], how="left").sort_values(["rank", "step"])
    ahead = every.groupby("rank")["flops"].ffill()
    every["held"] = pd.to_numeric(ahead.groupby(every["rank"]).bfill(), errors="coerce")
    out = out.drop(columns="flops").merge(every[["rank", "step", "held"]], on=["rank", "step"], how="left")
    return out.rename(columns={"held": "flops"})


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.integers(0, 3), st.just(float("nan"))),
            st.one_of(st.integers(0, 8), st.just(float("nan"))),
        ),
        max_size=30,
    ),
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 9), st.one_of(st.just(float("nan")), st.integers(1, 9))),
        max_size=20,
        unique_by=lambda row: row[:2],
    ),
    st.booleans(),
    st.booleans(),
)
def test_held_flops_gives_what_the_merges_gave(steps, counted, whole, ints):
    """Steps repeated, null (rank or step) or before a rank's first sample; samples on steps with no duration;
    a rank with no sample or only null ones; every step sampled with integer counts (their dtype
    kept, as the merges kept it); steps in any order."""
    steps_df = pd.DataFrame(steps, columns=["rank", "step"]).assign(dur=1)
    for col in ("rank", "step"):
        if steps_df[col].notna().all():
            steps_df[col] = steps_df[col].astype("int64")
    typed = {"rank": "int64", "step": "int64", "flops": "float64"}  # step_flops's
    c = pd.DataFrame(counted, columns=["rank", "step", "flops"]).astype(typed)
    if whole:  # every step counted
        every = steps_df[["rank", "step"]].dropna().drop_duplicates().assign(flops=7.0).astype(typed)
        c = pd.concat([c, every]).drop_duplicates(["rank", "step"], keep="last")
    if ints:
        c = c.dropna().astype({"flops": "int64"})
    if c.empty:
        return  # per_step_of does not search for no sample
    c = c.reset_index(drop=True)
    got = throughput._held_flops(steps_df, c)
    want = _held_flops_merged(steps_df, c)
    pd.testing.assert_series_equal(got["sampled"], want["sampled"], check_names=False)
    pd.testing.assert_series_equal(got["flops"], want["flops"], check_names=False, check_index=False)
