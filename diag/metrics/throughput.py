"""Throughput: TFLOP/s per GPU, MFU, samples/s and tokens/s, per step and per rank.

What is counted (the measured view): the FLOPs diag's layer collector counted from the shapes of
the aten ops that really ran (collectors/flops.py: matmuls, convolutions, attention; 2 per
multiply-add) inside the outermost module records of a sampled step on a rank: its forward, its
backward and any activation recomputation run inside the backward, and only that rank's share under
tensor or pipeline parallelism. Ops outside every recorded module (a loss computed outside the
model) and element-wise ops are not counted. A step that was not sampled is taken to do the FLOPs
of the rank's nearest sampled step (exact where shapes follow a fixed batch). Sampled steps are
slowed by the counting itself, so a rank's figure is the median over its steady steps that were not
sampled (all steady steps when every step was sampled).

Samples and tokens: a step record's `samples` is the job's (DeepSpeed's `global_samples` delta:
micro batch x gradient accumulation x DP, the same on every rank). A rank's rate is its
data-parallel replica's share (samples / dp / step time: the ranks of one replica under TP/PP work
on the same samples), unknown where dp is; the job's rate is the global batch over the job's step
time (`job_rates`).

The model view (model_flops): Megatron's analytic FLOPs of one iteration over the whole world, per
GPU: model FLOPs / (iteration time x world size), the figure Megatron prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diag.metrics import positions
from diag.metrics.agg import named
from diag.metrics.steps import NS, by_ranks, in_order, nth_step, steady

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics

STEP_COLUMNS = [
    "rank",
    "step",
    "dur_ns",
    "sampled",
    "samples",
    "tokens",
    "flops",
    "tflops",
    "mfu",
    "samples_per_s",
    "tokens_per_s",
]
RANK_COLUMNS = [
    "rank",
    "steps",
    "flops_per_step",
    "step_ms",
    "tflops",
    "mfu",
    "samples_per_s",
    "tokens_per_s",
]


def step_flops(layers: pd.DataFrame) -> pd.DataFrame:
    """FLOPs per (rank, step): the sum over the step's outermost layer records (a record inside an
    earlier one's interval is part of it: records are inclusive). Null when one of them is null
    (a module whose FLOPs were never counted under its input signature). A chunk of ranks' records
    at a time (`positions.rank_chunks`: whole ranks' rows of the trace's frame): the copy and sort
    of every record took +108 MiB at 64 ranks x 1,000 steps (1,026,048 records), and one rank at a
    time cost a sort per rank and window of steps however few its records."""
    cols = ["rank", "step", "flops"]
    if layers.empty or not {"ts", "dur", "flops"} <= set(layers.columns):
        return pd.DataFrame(columns=cols)
    chunks = positions.rank_chunks(pd.factorize(layers["rank"], sort=True)[0])
    parts = [part for rows in chunks if len(part := _chunk_flops(layers.iloc[rows]))]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def _chunk_flops(layers: pd.DataFrame) -> pd.DataFrame:
    """`step_flops` of whole ranks' records, in (rank, step) order (empty where none has a time)."""
    d = layers[["rank", "step", "ts", "dur", "flops"]].dropna(subset=["ts", "dur"])
    if d.empty:
        return d
    d = d.assign(ts=d["ts"].astype("int64"), flops=pd.to_numeric(d["flops"], errors="coerce"))
    d = d.assign(end=d["ts"] + d["dur"].astype("int64"))
    d = d.sort_values(["rank", "step", "ts", "end"], ascending=[True, True, True, False], kind="stable")
    reach = d.groupby(["rank", "step"], sort=False)["end"].cummax()
    prev = reach.groupby([d["rank"], d["step"]], sort=False).shift()
    outer = d[prev.isna() | (d["end"] > prev)]
    g = outer.groupby(["rank", "step"], observed=True)["flops"]
    out = g.sum(min_count=1).where(g.count() == g.size())
    return out.rename("flops").reset_index()


@dataclass(frozen=True)
class StepFlops:
    """`step_flops` of the trace's layer records: a (rank, step)'s records lie in one window of
    steps, so the windows' rows concatenate (in (rank, step) order, as the whole trace's)."""

    def of(self, metrics: Metrics) -> pd.DataFrame:
        return step_flops(metrics.trace.layers)

    def merged(self, parts: list[pd.DataFrame]) -> pd.DataFrame:
        rows = [p for p in parts if len(p)]
        if len(rows) <= 1:
            return rows[0] if rows else step_flops(pd.DataFrame())
        return pd.concat(rows, ignore_index=True).sort_values(
            ["rank", "step"], kind="stable", ignore_index=True
        )


def per_step(
    steps: pd.DataFrame,
    layers: pd.DataFrame,
    peak_tflops: float | None,
    seq_length: int | None,
    dp: int | None = None,
) -> pd.DataFrame:
    """`per_step_of` the FLOPs counted in `layers` (layer records, `step_flops`)."""
    return per_step_of(steps, step_flops(layers), peak_tflops, seq_length, dp)


def per_step_of(
    steps: pd.DataFrame,
    counted: pd.DataFrame,
    peak_tflops: float | None,
    seq_length: int | None,
    dp: int | None = None,
) -> pd.DataFrame:
    """One row per (rank, step) with a duration (`steps` is `Metrics.steps`; `counted` the FLOPs
    per sampled (rank, step), `step_flops`): `samples`/`tokens` the job's per step,
    `samples_per_s`/`tokens_per_s` the rank's replica's (NaN without `dp`)."""
    if steps.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    st = steps[["rank", "step", "dur"]]  # (copy-on-write: the columns are the step frame's until written)
    st["samples"] = pd.to_numeric(steps["samples"], errors="coerce") if "samples" in steps else np.nan
    st["tokens"] = pd.to_numeric(steps["tokens"], errors="coerce") if "tokens" in steps else np.nan
    if counted.empty:  # no step counted (no per-layer records): nothing to hold, the merges skipped
        st["sampled"], st["flops"] = False, np.nan
    else:
        st = _held_flops(st, counted)
    sec = st["dur"].astype(float) / NS
    st["dur_ns"] = st["dur"]
    st["tflops"] = st["flops"] / sec / 1e12
    st["mfu"] = st["tflops"] / peak_tflops if peak_tflops else np.nan
    if seq_length and st["tokens"].isna().all():
        st["tokens"] = st["samples"] * seq_length
    st["samples_per_s"] = st["samples"] / (dp or np.nan) / sec
    st["tokens_per_s"] = st["tokens"] / (dp or np.nan) / sec
    return st[STEP_COLUMNS].reset_index(drop=True)


def _held_flops(st: pd.DataFrame, counted: pd.DataFrame) -> pd.DataFrame:
    """`st` with `sampled` (FLOPs counted on that step) and `flops`: each rank's counted FLOPs held
    over the steps between samples (a sample on a step without a duration, such as the first one
    seen, still tells the FLOPs of the steps after it), and before its first sample the first's.
    `counted`'s (rank, step) keys are unique (`step_flops` groups by them). A search of each rank's
    few sampled steps, a rank at a time: the merges over the union of both frames' keys that did
    this were 44.5 MiB (~91 bytes a rank-step) of the report's high-water mark at 256 ranks x 2,000
    steps; this holds the two columns it makes and the rows' rank codes (`by_ranks`)."""
    flops = pd.to_numeric(counted["flops"], errors="coerce")
    known = flops.notna().to_numpy()
    c_rank, c_step = counted["rank"].to_numpy()[known], counted["step"].to_numpy()[known]
    c_flops = flops.to_numpy()[known]
    by = np.lexsort((c_step, c_rank))
    c_rank, c_step, c_flops = c_rank[by], c_step[by], c_flops[by]
    rank, step = st["rank"].to_numpy(), st["step"].to_numpy()
    held = np.zeros(len(st), dtype=c_flops.dtype)
    has = np.zeros(len(st), dtype=bool)
    sampled = np.zeros(len(st), dtype=bool)
    for rows in by_ranks(st["rank"]):  # (slices where the rows are by rank, as a step frame's)
        mine = rank[rows][0]
        lo, hi = np.searchsorted(c_rank, mine, "left"), np.searchsorted(c_rank, mine, "right")
        if lo == hi:  # no sample on this rank
            continue
        steps = step[rows]
        # the rank's last sample at or before the step (a null step: its last), else its first
        at = np.maximum(np.searchsorted(c_step[lo:hi], steps, "right") - 1, 0)
        held[rows] = c_flops[lo:hi][at]
        has[rows] = True
        sampled[rows] = c_step[lo:hi][at] == steps
    out = st.copy(deep=False)
    out["sampled"] = sampled
    if held.dtype.kind in "iu" and sampled.all():  # every step sampled: the counts' integers
        out["flops"] = held
    else:
        out["flops"] = np.where(has, held, np.nan)
    return out


_MEDIANS = {  # per_rank's columns: the rows' column each is the median of
    "flops_per_step": "flops",
    "step_ms": "dur_ns",
    **{col: col for col in ("tflops", "mfu", "samples_per_s", "tokens_per_s")},
}


def per_rank(rows: pd.DataFrame) -> pd.DataFrame:
    """Per rank: medians over its steady steps (`steady`, a rank at a time) that were not sampled
    (all steady ones if none). One groupby of every rank's rows, not a `steady` and six medians a
    rank: 10 ms a rank, 2.5 s of a 256-rank job's report."""
    if rows.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    rank = rows["rank"].reset_index(drop=True)
    kept = _past_warm_up(rank, rows["step"].reset_index(drop=True))
    unsampled = (~rows["sampled"]).to_numpy()
    some = pd.Series(kept & unsampled).groupby(rank).transform("any").to_numpy()
    quiet = kept & (unsampled | ~some)
    # (one column of the quiet rows at a time: the masks and a copy of every column read were
    # 90 of a 256-rank x 2,000-step run's 486 MiB peak, the copy alone 56 bytes a rank-step)
    by = rank.to_numpy()[quiet]
    out = pd.DataFrame(
        {
            "steps": pd.Series(by).groupby(by).size(),
            **{name: _medians(rows[col], quiet, by) for name, col in _MEDIANS.items()},
        }
    ).reindex(np.unique(rank.dropna().to_numpy()))
    out["step_ms"] /= 1e6
    out["steps"] = out["steps"].fillna(0).astype("int64")  # a rank none of whose steps is steady
    return out.rename_axis("rank").reset_index()[RANK_COLUMNS]


def _medians(col: pd.Series, rows: np.ndarray, by: np.ndarray) -> pd.Series:
    """The median of `col`'s `rows` per rank (`by`, the ranks of those rows)."""
    return pd.Series(col.to_numpy()[rows]).groupby(by).median()


def _past_warm_up(rank: pd.Series, step: pd.Series) -> np.ndarray:
    """Whether each row is past its rank's warm-up: not its rank's first step, unless the rank has
    two steps or fewer. Rows in (rank, step) order (a step frame's) are told by their position."""
    if in_order(rank, step):
        r = rank.to_numpy()
        starts = positions.starts_of(r)
        sizes = np.diff(np.r_[starts, len(r)])
        past = np.ones(len(r), dtype=bool)
        past[starts] = False
        return np.repeat(sizes <= 2, sizes) | past
    return ((rank.groupby(rank).transform("size") <= 2) | (step >= nth_step(rank, step, 1))).to_numpy()


def data_parallel(layout: dict[str, object]) -> int | None:
    """The job's DP size: the recorded one, else world / (TP x PP) where all three are recorded
    (a world size alone is no DP size: a TP=2 job's is 1)."""
    dp, world, tp, pp = (layout.get(k) for k in ("dp", "world_size", "tp", "pp"))
    if isinstance(dp, int) and dp > 0:
        return dp
    if isinstance(world, int) and isinstance(tp, int) and isinstance(pp, int) and min(world, tp, pp) > 0:
        return world // (tp * pp)
    return None


def job_steps(rows: pd.DataFrame) -> pd.DataFrame:
    """Per step the job's: slowest rank's dur, samples and tokens, sampled by any rank; steady steps
    that were not sampled (all steady ones if every step was). What `job_step_s` and `job_rates`
    read: compute it once and pass it to both (its groupby is most of their time on a small trace)."""
    if rows.empty:
        return rows
    job = named(
        rows.groupby("step"),
        dur=("dur_ns", "max"),
        sampled=("sampled", "any"),
        samples=("samples", "max"),
        tokens=("tokens", "max"),
    )
    job = steady(job.reset_index().pipe(lambda j: j.assign(rank=0, dur_s=j["dur"] / NS)))
    return job[~job["sampled"]] if (~job["sampled"]).any() else job


def job_step_s(rows: pd.DataFrame, quiet: pd.DataFrame | None = None) -> float | None:
    """The job's iteration time: per step the slowest rank, median over steady, unsampled steps
    (`quiet`: `job_steps(rows)`, when already computed)."""
    quiet = job_steps(rows) if quiet is None else quiet
    return float(quiet["dur"].median()) / NS if len(quiet) else None


def job_rates(rows: pd.DataFrame, quiet: pd.DataFrame | None = None) -> dict[str, float | None]:
    """The job's samples/s and tokens/s: the global batch over the job's step time, median over the
    steps `job_step_s` reads (None where the job does not say)."""
    quiet = job_steps(rows) if quiet is None else quiet
    out: dict[str, float | None] = {}
    for col in ("samples", "tokens"):
        v = (pd.to_numeric(quiet[col], errors="coerce") / quiet["dur_s"]).median() if len(quiet) else np.nan
        out[f"{col}_per_s"] = None if pd.isna(v) else float(v)
    return out
