"""Split every (rank, step) into where its time went, in integer nanoseconds that sum to the step.

Inside a step's window [start, start + dur) each instant gets ONE label, by priority:
1. a blocking collective timed on the host (`comm:<op>:<role>`; CPU/gloo): the rank waits in it,
   whatever else runs;
2. compute: per-layer forward/backward records (diag traces) or compute kernels/ops (Kineto);
3. a non-blocking collective, or any collective timed on a GPU (NCCL kernels on their own stream),
   where no compute hides it (exposed communication);
4. the optimizer: `Optimizer.*` ops (Kineto);
5. what is left: on a GPU timeline `idle` (the device waits for the host); on a host timeline,
   before the first compute `idle` (input wait), after the last compute `optimizer` (diag traces
   record no optimizer event: the host work after backward is the optimizer step and its
   bookkeeping), in between `other`.
A step the optimizer skipped (fp16 overflow) is all `skipped`. A step without per-layer records (diag
samples layers every N steps) is estimated: compute and optimizer take the rank's median on sampled
steps (capped by the time left outside collectives), the rest is `idle`; `sampled` says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diag.diff import adapter
from diag.diff.align import comm_roles
from diag.metrics.step_split import claim

if TYPE_CHECKING:
    from diag.trace.model import Trace

COMPUTE, IDLE, OPTIMIZER, OTHER, SKIPPED = "compute", "idle", "optimizer", "other", "skipped"


@dataclass
class Labeled:
    """One rank's intervals of one label (sorted by start)."""

    label: str
    ts: np.ndarray
    end: np.ndarray

    def clip(self, start: int, stop: int) -> adapter.Spans:
        keep = (self.end > start) & (self.ts < stop)
        return adapter.union(np.maximum(self.ts[keep], start), np.minimum(self.end[keep], stop))


@dataclass
class RankIntervals:
    """Everything that can claim a rank's time, in priority order."""

    blocking: list[Labeled] = field(default_factory=list)
    compute: Labeled | None = None
    background: list[Labeled] = field(default_factory=list)
    optimizer: Labeled | None = None
    on_device: bool = False  # a GPU timeline: a gap between kernels is the device idling


def _labeled(label: str, df: pd.DataFrame, end: pd.Series | None = None) -> Labeled:
    ts = df["ts"].to_numpy(np.int64)
    stop = (df["ts"] + df["dur"]).to_numpy(np.int64) if end is None else end.to_numpy(np.int64)
    order = np.argsort(ts, kind="stable")
    return Labeled(label, ts[order], stop[order])


def device_timed(trace: Trace, rank: int) -> bool:
    """Whether the rank's collectives are timed on a GPU (NCCL kernels, CUDA events): they run on
    their own stream, so only the part no compute hides is exposed, blocking call or not."""
    k = trace.frame("kernel")
    if "kind" in k.columns and (k["rank"] == rank).any():
        return True
    m = trace.memory
    dev = m.loc[m["rank"] == rank, "device"].dropna().astype(str) if "device" in m.columns else []
    return any(d.startswith("cuda") for d in dev)


def rank_intervals(trace: Trace, rank: int) -> RankIntervals:
    out = RankIntervals()
    comms = comm_roles(trace)
    mine = comms[(comms["rank"] == rank) & comms["dur"].notna() & comms["ts"].notna()]
    out.on_device = device_timed(trace, rank)
    for (key, bg), df in mine.groupby(["key", "async_op"], observed=True, sort=True):
        (out.background if bg or out.on_device else out.blocking).append(_labeled(f"comm:{key}", df))
    layers = trace.layers
    layers = layers[(layers["rank"] == rank) & layers["dur"].notna()] if "ts" in layers else layers.iloc[:0]
    if len(layers):
        out.compute = _labeled(COMPUTE, layers)
    else:
        act, _ = adapter.activity(trace, rank)
        act = act[act["kind"] == adapter.compute_kind()]
        if len(act):
            out.compute = _labeled(COMPUTE, act, act["end"])
    ops = trace.frame("cpu_op")
    if "name" in ops.columns and len(ops):
        opt = ops[(ops["rank"] == rank) & ops["name"].astype(str).str.startswith("Optimizer.")]
        if len(opt):
            out.optimizer = _labeled(OPTIMIZER, opt)
    return out


def _step(iv: RankIntervals, start: int, stop: int) -> tuple[dict[str, int], bool]:
    """Labels of one step window; the bool says whether compute was recorded inside it."""
    comp = iv.compute.clip(start, stop) if iv.compute is not None else adapter.union([], [])
    order = [(lab.label, lab.clip(start, stop)) for lab in iv.blocking]
    order += [(COMPUTE, comp)] + [(lab.label, lab.clip(start, stop)) for lab in iv.background]
    if iv.optimizer is not None:
        order.append((OPTIMIZER, iv.optimizer.clip(start, stop)))
    sampled = len(comp[0]) > 0
    if sampled and not iv.on_device:
        first, last = int(comp[0][0]), int(comp[1][-1])
        order.append((IDLE, adapter.union([start], [first])))
        order.append((OTHER if iv.optimizer is not None else OPTIMIZER, adapter.union([last], [stop])))
    parts = claim(order)
    rest = (stop - start) - sum(parts.values())
    label = OTHER if sampled and not iv.on_device else IDLE
    if rest:
        parts[label] = parts.get(label, 0) + rest
    return parts, sampled


def _windows(trace: Trace) -> pd.DataFrame:
    """rank, step, ts (None when unknown), dur_ns, applied of every timed step."""
    times = adapter.step_times(trace)
    st = trace.steps
    extra = ["ts", "applied"] if {"ts", "applied"} <= set(st.columns) else []
    if extra and len(st):
        times = times.merge(
            st[["rank", "step", *extra]].drop_duplicates(["rank", "step"]), on=["rank", "step"], how="left"
        )
    for col, default in (("ts", None), ("applied", True)):
        if col not in times.columns:
            times[col] = default
    return times


def _skipped(trace: Trace, w: pd.DataFrame) -> pd.Series:
    """Steps whose update was not applied: the step record's flag, else the log's count of skipped
    iterations (Megatron prints it per logging interval: > 0 marks the logged iteration)."""
    skipped = ~w["applied"].astype("boolean").fillna(True)
    log = trace.frame("log_step")
    if "skipped_iters" in log.columns and log["skipped_iters"].notna().any():
        bad = set(log.loc[pd.to_numeric(log["skipped_iters"], errors="coerce") > 0, "step"].astype(int))
        skipped = skipped | w["step"].astype(int).isin(bad)
    return skipped.astype(bool)


def split(trace: Trace) -> pd.DataFrame:
    """One row per timed (rank, step): rank, step, dur_ns, sampled, then one int column per label."""
    w = _windows(trace)
    w = w.assign(skipped=_skipped(trace, w).to_numpy())
    rows: list[dict[str, object]] = []
    for rank, steps in w.groupby("rank", sort=True):
        iv = rank_intervals(trace, int(rank)) if steps["ts"].notna().any() else RankIntervals()
        for r in steps.itertuples(index=False):
            dur = int(r.dur_ns)
            if r.skipped:
                parts, sampled = {SKIPPED: dur}, True
            elif pd.isna(r.ts):
                parts, sampled = {OTHER: dur}, True
            else:
                parts, sampled = _step(iv, int(r.ts), int(r.ts) + dur)
            rows.append({"rank": int(rank), "step": int(r.step), "dur_ns": dur, "sampled": sampled, **parts})
    df = pd.DataFrame(rows).fillna(0)
    labels = [c for c in df.columns if c not in ("rank", "step", "dur_ns", "sampled")]
    df[labels] = df[labels].astype("int64")
    return _estimate(df, _layer_compute(trace))


def _layer_compute(trace: Trace) -> pd.Series:
    """Per rank: median per-step union of layer records, by the records' own step (the first step
    has layer records but no window)."""
    lay = trace.layers
    if lay.empty or "ts" not in lay.columns:
        return pd.Series(dtype=float)
    per = adapter.union_by_group(lay.dropna(subset=["ts", "dur"]), ["rank", "step"])
    return per.groupby(level="rank").median()


def _estimate(df: pd.DataFrame, fallback: pd.Series) -> pd.DataFrame:
    """Unsampled steps: move the rank's median sampled compute and optimizer time out of `idle`."""
    if df.empty or df["sampled"].all():
        return df
    for col in (COMPUTE, OPTIMIZER):
        if col not in df.columns:
            df[col] = 0
    ok = df[df["sampled"] & (df[COMPUTE] > 0)]
    med = ok.groupby("rank")[[COMPUTE, OPTIMIZER]].median()
    if med.empty and not fallback.empty:  # ranks do equal work: the least busy one did no waiting
        med = pd.DataFrame({COMPUTE: fallback.min(), OPTIMIZER: 0.0}, index=fallback.index)
    if med.empty:
        return df
    if IDLE not in df.columns:
        df[IDLE] = 0
    todo = ~df["sampled"]
    for col in (COMPUTE, OPTIMIZER):
        want = df.loc[todo, "rank"].map(med[col]).fillna(med[col].median()).round().astype("int64")
        move = np.minimum(want.to_numpy(), df.loc[todo, IDLE].to_numpy())
        df.loc[todo, col] += move
        df.loc[todo, IDLE] -= move
    return df
