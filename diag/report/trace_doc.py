"""The report's per-signal sections of a diag trace: top layers, steps, memory (peaks and timeline),
overflows. Plain rows for the document; the renderers format them (diag/report/trace_tables.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diag.metrics import layer_sums
from diag.metrics import steps as step_frames
from diag.metrics.layer_stats import LayerSums, model_wide_layers, steady_sums
from diag.report import kept_ranks
from diag.report.records import Records

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace


def layers(
    trace: Trace,
    peak_tflops: float | None,
    steady: pd.DataFrame | None = None,
    metrics: Metrics | None = None,
) -> list[dict[str, Any]]:
    """The top layers over the steady samples (`steady`: the steady steps, `Metrics.steady_steps`;
    the warm-up's samples only where a rank has no other), each module's from its lowest rank, of
    the layer records summed per (module, rank, warm-up) (`layer_sums`): `metrics`' (the report's:
    its `LayerSums`, which the windowed pass sums a window of steps at a time), else `trace`'s."""
    if metrics is not None:
        sums = metrics.reduce(LayerSums())
    else:
        if steady is None:
            steady = step_frames.steady(step_frames.step_frame(trace.steps))
        sums = steady_sums(model_wide_layers(trace), steady)
    return layer_sums.table(layer_sums.chosen(sums), peak_tflops).astype(object).to_dict("records")


def steps(per_step: Records, trace: Trace) -> Records | list[dict[str, Any]]:
    """One row per step: the slowest and fastest rank's time, whether every rank applied it, and the
    throughput figures (FLOP/s: mean over ranks; samples/s: the job's). Without the trace's steps,
    the training log's timed iterations (`log_steps`). `per_step`'s frame is read as it is (a frame
    of its rows again took +23 MiB at 64 ranks x 1,000 steps); every step at once, as columns: a
    step's own pandas calls (~0.1 ms) were ~2 s of a 22,400-step DDP job's report, a row's dict and
    its `iloc` reads 1.8 s more."""
    df = per_step.frame
    if df.empty:
        return log_steps(trace.frame("log_step"))
    st = trace.steps
    flags = st["applied"].astype("boolean").fillna(True) if not st.empty else pd.Series(dtype=bool)
    applied = flags.groupby(st["step"]).all() if not st.empty else flags
    by = df.groupby("step")
    slow = df.loc[by["dur_ns"].idxmax().to_numpy()]  # the first of a step's slowest ranks
    low, size, sampled = by["dur_ns"].min(), by.size(), by["sampled"].any()
    dur = slow["dur_ns"].to_numpy()
    return Records(
        pd.DataFrame(
            {
                "step": low.index.to_numpy().astype(np.int64),
                "ranks": size.to_numpy().astype(np.int64),
                "max_ms": dur / 1e6,
                "min_ms": low.to_numpy() / 1e6,
                "slowest_rank": slow["rank"].to_numpy().astype(np.int64),
                "applied": applied.reindex(low.index).fillna(True).to_numpy().astype(bool),
                "sampled": sampled.to_numpy().astype(bool),
                "tflops": _means(df["tflops"], df["step"], low.index),
                "samples_per_s": slow["samples"].to_numpy() / dur * 1e9,  # the job's: over the slowest
            }
        )
    )


def _means(values: pd.Series, keys: pd.Series, steps: pd.Index) -> np.ndarray:
    """Each step's `values.mean()` as pandas makes it for one step's rows (NaN skipped, numpy's sum
    in row order over the count): a groupby's mean sums otherwise (compensated), unlike it in the
    last bits."""
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    order = np.argsort(keys.to_numpy(), kind="stable")
    ordered, wanted = keys.to_numpy()[order], steps.to_numpy()
    cuts, ends = np.searchsorted(ordered, wanted, side="left"), np.searchsorted(ordered, wanted, side="right")
    out = np.full(len(steps), np.nan)
    for i, (a, b) in enumerate(zip(cuts, ends)):
        part = v[order[a:b]]
        known = ~np.isnan(part)
        count = int(known.sum())
        if count:
            out[i] = np.where(known, part, 0.0).sum(dtype=np.float64) / np.float64(count)
    return out


def log_steps(log: pd.DataFrame) -> list[dict[str, Any]]:
    """`steps`' rows from a training log's iterations with a time: per iteration the slowest and
    fastest rank that logged it, applied unless the log counted it skipped (None: a skip in a
    logging interval of several iterations, not known to be this one), the FLOP/s the log
    printed (none where it printed 0: Megatron's on a CPU) and the job's samples/s it printed, else
    its global batch over the slowest time. Nothing is sampled: a log counts no FLOPs."""
    if log.empty or "iter_ms" not in log.columns:
        return []
    timed = log[pd.to_numeric(log["iter_ms"], errors="coerce") > 0]
    out = []
    before = 0  # the iteration logged last: a line's skip count covers the iterations since
    for step, g in timed.groupby("step", sort=True):
        ms = pd.to_numeric(g["iter_ms"])
        slow = g.loc[ms.idxmax()]
        skipped = bool((_num(g, "skipped_iters") > 0).any())
        # one iteration per line: the count is that iteration's; over an interval, which one is unknown
        applied = (None if int(step) - before > 1 else False) if skipped else True
        before = int(step)
        out.append(
            {
                "step": int(step),
                "ranks": len(g),
                "max_ms": float(ms.max()),
                "min_ms": float(ms.min()),
                "slowest_rank": int(slow["rank"]),
                "applied": applied,
                "sampled": False,
                "tflops": _positive(_num(g, "tflops").mean()),
                "samples_per_s": _positive(_num(g, "samples_per_sec").max())
                or _positive(float(_num(g, "global_batch").max()) / float(ms.max()) * 1e3),
            }
        )
    return out


def _num(g: pd.DataFrame, col: str) -> pd.Series:
    return (
        pd.to_numeric(g[col], errors="coerce") if col in g.columns else pd.Series(float("nan"), index=g.index)
    )


def _positive(v: float) -> float | None:
    return float(v) if v == v and v > 0 else None


def memory(trace: Trace, ranks: list[int] | None = None) -> dict[str, Any]:
    """`peaks`: per rank device, peak allocated/reserved, capacity, peak RSS; `timeline`: the memory
    records (rank, step, allocated, reserved, rss; bytes) of `ranks` (None: every rank's), `Records`
    (one per rank and step); `by_step`: each step's highest across every rank (`kept_ranks.by_step`)."""
    mem = trace.memory
    if mem.empty:
        return {"peaks": [], "timeline": [], "by_step": []}
    peaks = []
    for rank, df in mem.groupby("rank"):
        num = {
            c: pd.to_numeric(df[c], errors="coerce")
            for c in ("allocated", "reserved", "peak", "rss", "capacity")
        }
        peak = num["peak"].max() if num["peak"].notna().any() else num["allocated"].max()
        cap = num["capacity"].max()
        device = str(df["device"].dropna().iloc[-1]) if df["device"].notna().any() else "?"
        peaks.append(
            {
                "rank": int(rank),
                "device": device,
                "peak_allocated": peak,
                "peak_reserved": num["reserved"].max(),
                "capacity": cap,
                "peak_rss": num["rss"].max(),
                "peak_share": (peak / cap if device != "cpu" and cap and peak == peak else None),
            }
        )
    cols = ["rank", "step", "ts", "allocated", "reserved", "rss"]
    return {
        "peaks": peaks,
        "timeline": Records(kept_ranks.only(mem[[c for c in cols if c in mem.columns]], ranks)),
        "by_step": Records(kept_ranks.by_step(mem)),
    }


def overflows(trace: Trace) -> list[dict[str, Any]]:
    ov = trace.overflow
    if ov.empty or "overflow" not in ov.columns:
        return []
    hit = ov[ov["overflow"].astype("boolean").fillna(False)]
    cols = ["rank", "step", "scale_before", "scale_after", "source"]
    return hit[[c for c in cols if c in hit.columns]].astype(object).to_dict("records")


TIMELINE_RANKS, TIMELINE_STEPS = 32, 100  # lanes and steps the step timeline keeps (a readable plot)


def step_timeline(trace: Trace) -> list[dict[str, Any]]:
    """Each rank's steps in time: rank, step, start_ms (from the first step kept), dur_ms, applied;
    the lowest `TIMELINE_RANKS` ranks and the last `TIMELINE_STEPS` step numbers."""
    st = trace.steps
    if st.empty or not {"ts", "dur"} <= set(st.columns):
        return []
    # (masks first, then one copy of the rows kept: the step records copied whole twice, ~90 bytes a
    # rank-step, were the windowed pass's high-water mark at 256 ranks x 500 steps)
    # (numpy's, not a Series' masks and `isin`: those were 47 bytes a rank-step, the report's
    # high-water mark at 256 ranks x 2,000 steps once the rules' had gone)
    keep = (st["ts"].notna() & st["dur"].notna() & st["step"].notna()).to_numpy()
    for col, lanes in (("rank", slice(TIMELINE_RANKS)), ("step", slice(-TIMELINE_STEPS, None))):
        values = st[col].to_numpy()
        keep = keep & np.isin(values, np.unique(values[keep])[lanes])
    st = st[keep]
    if st.empty:
        return []
    t0 = st["ts"].min()
    applied = st["applied"] if "applied" in st.columns else pd.Series(True, index=st.index)
    out = pd.DataFrame(
        {
            "rank": st["rank"].astype(int),
            "step": st["step"].astype(int),
            "start_ms": ((st["ts"] - t0) / 1e6).round(3),
            "dur_ms": (st["dur"] / 1e6).round(3),
            "applied": applied.map(lambda a: a is not False),
        }
    )
    return out.sort_values(["rank", "step"]).astype(object).to_dict("records")
