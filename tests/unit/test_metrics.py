"""Trace metrics: interval arithmetic against brute force, breakdown/overlap/straggler definitions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diag import schema
from diag.metrics import breakdown, intervals
from diag.metrics.activity import ByRank
from diag.trace.model import Trace

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 15)), max_size=12)


def _cover(pairs):
    return {t for ts, d in pairs for t in range(ts, ts + d)}


def _merged(pairs):
    ts = np.array([p[0] for p in pairs], dtype=np.int64)
    return intervals.merge(ts, ts + np.array([p[1] for p in pairs], dtype=np.int64))


@settings(max_examples=150, deadline=None)
@given(spans, spans)
def test_union_and_overlap_equal_brute_force(a, b):
    ma, mb = _merged(a), _merged(b)
    assert intervals.total(*ma) == len(_cover(a))
    assert (ma[0][1:] > ma[1][:-1]).all()  # disjoint and sorted
    assert intervals.overlap(ma, mb) == len(_cover(a) & _cover(b))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(1, 9)), min_size=1, max_size=20))
def test_union_by_group_equals_per_group_union(rows):
    df = pd.DataFrame(rows, columns=["rank", "ts", "dur"])
    got = intervals.union_by_group(df, ["rank"])
    for rank, part in df.groupby("rank"):
        assert got[rank] == len(_cover(zip(part["ts"], part["dur"])))


def _kernel_trace(rows, steps=((0, 0, 100), (1, 100, 100))):
    k = pd.DataFrame(rows, columns=["rank", "name", "kind", "ts", "dur"])
    k = k.assign(stream=7, correlation=range(len(k)), launch_ts=k["ts"], step=0)
    st_ = pd.DataFrame(steps, columns=["step", "ts", "dur"]).assign(rank=0)
    return Trace(headers={0: {"rank": 0}}, frames={"kernel": k, schema.STEP: st_})


def test_breakdown_and_overlap_definitions():
    tr = _kernel_trace(
        [
            (0, "gemm", "compute", 0, 10),
            (0, "gemm", "compute", 5, 10),
            (0, "ncclDevKernel_AllReduce", "comm", 12, 8),
            (0, "Memcpy", "memory", 30, 10),
            (0, "late", "compute", 150, 10),
        ]
    )  # launched in the last step: not counted
    row = breakdown.temporal_breakdown(tr).iloc[0]
    assert (row["total_ns"], row["idle_ns"], row["compute_ns"], row["non_compute_ns"]) == (40, 10, 15, 15)
    assert row["idle_pct"] == 25.0
    ov = breakdown.comm_overlap(tr).iloc[0]
    assert (ov["comm_ns"], ov["overlap_ns"], ov["overlap_pct"]) == (8, 3, 37.5)


def _comm_trace(durs_by_rank):
    rows = [
        {
            "rank": r,
            "step": 0,
            "op": "all_reduce",
            "bytes": 1 << 20,
            "group": "world:0",
            "group_size": 2,
            "ts": 100 * i,
            "dur": d,
            "busbw": 0.0,
        }
        for r, durs in durs_by_rank.items()
        for i, d in enumerate(durs)
    ]
    return Trace(headers={r: {} for r in durs_by_rank}, frames={schema.COMM: pd.DataFrame(rows)})


def test_straggler_is_the_rank_others_wait_for():
    tr = _comm_trace({0: [50, 60, 55, 10], 1: [5, 6, 4, 40]})  # rank 1 arrives last 3 of 4 times
    df = breakdown.stragglers(tr).set_index("rank")
    assert df.loc[1, "last_arrival_frac"] == 0.75 and df.loc[0, "last_arrival_frac"] == 0.25
    assert "straggler" not in df.columns  # a measure only; the verdict is the straggler rule's


def test_collective_bandwidth_uses_nccl_tests_factor():
    stats = breakdown.collective_stats(_comm_trace({0: [1 << 20], 1: [1 << 19]})).set_index("rank")
    assert stats.loc[0, "algbw"] == pytest.approx(1.0)  # 1 MiB in 1 Mi ns = 1 GB/s
    assert stats.loc[1, "busbw"] == pytest.approx(2.0 * 2 * 1 / 2)


def test_union_by_group_is_exact_at_epoch_nanoseconds():
    """float64 cannot hold epoch ns exactly (~256 ns steps): the union must not round."""
    import pandas as pd

    from diag.metrics.intervals import union_by_group

    base = 1_796_000_000_000_000_000
    df = pd.DataFrame(
        {"rank": [0, 0, 1], "ts": [base, base + 1, base + 7], "dur": pd.array([10, 10, 3], dtype="Float64")}
    )
    assert union_by_group(df, ["rank"]).to_dict() == {0: 11, 1: 3}


def test_one_stage_computes_each_figure_once(monkeypatch):
    """Rules and report read one `Metrics`: on a GPU trace (where exposed_comm reads the overlap and
    the breakdown) each figure is computed once for the whole analysis."""
    from diag.analyzers import run_all

    from diag.importers import load_inputs
    from diag.metrics.stage import Metrics
    from diag.report import model
    from tests.unit.kineto_samples import GPU_RANKS

    calls: dict[str, int] = {}
    for name in ("temporal_breakdown", "comm_overlap", "collective_stats", "stragglers", "step_times"):
        real = getattr(breakdown, name)

        def counted(trace, *args, _real=real, _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(trace, *args)

        monkeypatch.setattr(breakdown, name, counted)
    trace = load_inputs(GPU_RANKS)
    assert not trace.frame("kernel").empty
    m = Metrics(trace)
    findings, failures = run_all(trace, metrics=m)
    assert calls.get("comm_overlap") == calls.get("temporal_breakdown") == 1  # read by exposed_comm
    doc = model.build(trace, findings, failures, m)
    assert not failures and doc["metrics"]["breakdown"]
    assert calls == {
        "temporal_breakdown": 1,
        "comm_overlap": 1,
        "collective_stats": 1,
        "stragglers": 1,
        "step_times": 1,
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 99)), max_size=25), st.integers(0, 4))
def test_by_rank_holds_what_a_mask_selects(rows, rank):
    """The per-rank split the breakdown reads (one pass) is exactly the mask it replaced: same rows
    in the same order with their index, and an empty frame with the columns for an absent rank."""
    df = pd.DataFrame(rows, columns=["rank", "ts"])
    for frame in (df.iloc[::-1], df.sort_values("rank", kind="stable")):  # index arrays; slices
        pd.testing.assert_frame_equal(ByRank(frame)[rank], frame[frame["rank"] == rank])


def test_comm_frame_leaves_the_trace_frame_as_it_is():
    """`comm_frame` no longer copies the whole comm frame (a 64-rank trace's largest): the columns
    it adds (kind, dur_s) or drops (the writer's busbw: `bus_bandwidth` reads the canonical name)
    must not reach the trace's own frame."""
    import os

    from diag.metrics.comms import comm_frame
    from diag.metrics.steps import step_frame
    from diag.trace.reader import load_trace

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    trace = load_trace(os.path.join(root, "sample_traces", "zero3"))
    before = trace.comms.copy()
    out = comm_frame(trace.comms, step_frame(trace.steps))
    assert "kind" in out and "dur_s" in out and "busbw" not in out and len(out) == len(before)
    pd.testing.assert_frame_equal(trace.comms, before)


def test_collective_stats_keep_each_process_group_apart(tmp_path):
    """megatron-core at TP x DP: the tensor-parallel all_reduces and the data-parallel gradient
    all_reduce are one op in two groups; one row per (rank, op) summed both and averaged their sizes
    (Megatron-LM's run_simple_mcore_train_loop.py: 13 TP calls and 1 DP call a step)."""
    from tests.unit.synth_trace import Job

    job = Job(ranks=2, steps=2)
    for r in range(2):
        for s in range(2):
            for i in range(3):
                job.comm(r, s, nbytes=1 << 10, at_ms=10 + i, dur_ms=1, group="tp:12")
            job.comm(r, s, nbytes=1 << 20, at_ms=60, dur_ms=4, group="dp_cp:1")
    stats = breakdown.collective_stats(job.write(str(tmp_path))).set_index(["rank", "op", "group"])
    assert stats["calls"].to_dict() == {
        (r, "all_reduce", g): n for r in range(2) for g, n in (("dp_cp:1", 2), ("tp:12", 6))
    }
    assert stats.loc[(0, "all_reduce", "tp:12"), "mean_bytes"] == 1 << 10
    assert stats.loc[(1, "all_reduce", "dp_cp:1"), "mean_bytes"] == 1 << 20
