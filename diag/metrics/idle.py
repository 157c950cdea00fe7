"""Idle time before each step's work, per (rank, step): the gap after the previous step plus, on
sampled steps (per-layer records), the lead-in to the first forward, less the time spent in
collectives there. Read by idle_between_steps (an input stall) and straggler (which defers to it).

What it reads of the calls and layers is a `Reduction` (`Idle`, issue 14): a window of steps at a
time, its part carrying the pieces of the rank's collectives inside the idle windows, so that a
gap at a window's end, which the calls of both windows may cover, is their union, not a sum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diag.metrics import input_wait
from diag.metrics.activity import ByRank
from diag.metrics.steps import NS, steady

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

_PIECES = ["rank", "step", "which", "lo", "hi"]  # which: 0 the gap after the step, 1 its lead-in


def gaps(metrics: Metrics) -> pd.DataFrame:
    """Per (rank, step): idle seconds before the step's work: the gap after the previous step's end
    plus, where per-layer records exist (sampled steps), the lead-in from the step's start (the
    previous optimizer step's end) to its first forward. Steps recorded boundary to boundary have no
    gap, so the lead-in is where a slow data loader shows; in a profiler trace, the DataLoader's
    fetch inside the step with the device idle (`input_wait`, also as `loader_s`)."""
    st = metrics.steps
    if st.empty:
        return st.assign(
            gap_s=pd.Series(dtype=float), wall_s=pd.Series(dtype=float), comm_gap_s=pd.Series(dtype=float)
        )
    st = windows(st)
    idle = metrics.reduce(Idle())
    if idle.layers:
        st = with_lead(st, idle.first)
        st["gap_s"] = st["gap_s"] + st.pop("lead").fillna(0)
        st = st[st["first"].notna()] if st["first"].notna().any() else st
    else:
        st = st.assign(lead_hi=st["start"])
        ops = metrics.trace.frame("cpu_op")
        if not ops.empty:  # a profiler trace: its steps hold the batch's fetch (`input_wait`)
            waits = input_wait.loader_idle(ops, metrics.trace.frame("kernel"), st)
            st = st.assign(gap_s=st["gap_s"] + waits, loader_s=waits)
    st = st.assign(comm_gap_s=idle.busy(st))
    return steady(st)


def windows(st: pd.DataFrame) -> pd.DataFrame:
    """The steps (`Metrics.steps`, the whole trace's) with their gap after: `gap_s`, `wall_s` and
    its window [`lo`, `hi`] (the step's end to the next one's start)."""
    nxt = st.groupby("rank")["start"].shift(-1)
    between = ((nxt - st["end"]) / NS).fillna(0).clip(lower=0)
    return st.assign(gap_s=between, wall_s=st["dur_s"] + between, lo=st["end"], hi=nxt.fillna(st["end"]))


def with_lead(st: pd.DataFrame, first: pd.Series) -> pd.DataFrame:
    """`st` with each step's first forward (`first`: ts by (rank, step)), its lead-in seconds
    (`lead`, NaN where it has none before its end) and the lead-in window's end (`lead_hi`)."""
    st = st.merge(first.rename("first").reset_index(), on=["rank", "step"], how="left")
    lead = ((st["first"] - st["start"]) / NS).where(st["first"] < st["end"]).clip(lower=0)
    return st.assign(lead=lead, lead_hi=st["first"].where(lead.notna(), st["start"]))


@dataclass(frozen=True)
class IdleParts:
    """`Idle`'s figure: whether the trace holds per-layer records, each (rank, step)'s first forward
    (ts) and the pieces of the rank's collectives inside each step's idle windows (`_PIECES`:
    `lo`, `hi` in ns; a window's pieces of steps it does not hold end at those steps' end, not at
    their first forward, which it does not know)."""

    layers: bool
    first: pd.Series
    pieces: pd.DataFrame

    def busy(self, st: pd.DataFrame) -> np.ndarray:
        """Seconds of each row of `st` (`windows` with `lead_hi`) spent in collectives: the union
        of the pieces in its gap, plus in its lead-in (up to `lead_hi`)."""
        out = np.zeros(len(st))
        if self.pieces.empty:
            return out
        row = {key: i for i, key in enumerate(zip(st["rank"].tolist(), st["step"].tolist()))}
        cap = st["lead_hi"].to_numpy(dtype=float)
        for (rank, step, which), p in self.pieces.groupby(["rank", "step", "which"], sort=True):
            i = row.get((rank, step))
            if i is None:
                continue
            lo, hi = p["lo"].to_numpy(), p["hi"].to_numpy()
            if which:
                hi = np.minimum(hi, cap[i])
            keep = hi > lo
            if keep.any():
                order = np.argsort(lo[keep], kind="stable")
                s, e = _union(lo[keep][order], hi[keep][order])
                out[i] += float((e - s).sum()) / NS
        return out


@dataclass(frozen=True)
class Idle:
    """What `gaps` reads of the layers and calls (`IdleParts`). A window knows each of its steps'
    first forward (min: exact) and cuts its calls' union to the idle windows of every step of the
    whole trace (`Metrics.steps`); where a call of one window lies in another's idle window (a
    gap at the windows' boundary), `IdleParts.busy` unites the pieces of both."""

    def of(self, metrics: Metrics) -> IdleParts:
        lay = metrics.trace.layers
        if lay.empty:
            first = pd.Series(dtype=float)
        else:
            fwd = lay[lay["phase"].astype(str) == "fwd"]
            first = fwd.groupby(["rank", "step"], observed=True)["ts"].min()
        st = metrics.steps
        if st.empty or metrics.comms.empty or "ts" not in metrics.comms:
            return IdleParts(not lay.empty, first, pd.DataFrame(columns=_PIECES))
        st = with_lead(windows(st), first) if not lay.empty else windows(st).assign(lead_hi=st["start"])
        held = _held(metrics.trace)
        foreign = ~st["step"].between(*held) if held else pd.Series(True, index=st.index)
        st["lead_hi"] = st["lead_hi"].where(~foreign, st["end"])  # the rest of its lead-in: unknown here
        return IdleParts(not lay.empty, first, _pieces(metrics.comms, st))

    def merged(self, parts: list[IdleParts]) -> IdleParts:
        if len(parts) == 1:
            return parts[0]
        firsts = [p.first for p in parts if len(p.first)]
        pieces = [p.pieces for p in parts if len(p.pieces)]
        return IdleParts(
            any(p.layers for p in parts),
            pd.concat(firsts) if firsts else parts[0].first,
            pd.concat(pieces, ignore_index=True) if pieces else parts[0].pieces,
        )


def _held(trace: Trace) -> tuple[float, float] | None:
    """The steps whose layers and calls `trace` holds (a window: all of them), as (first, last)."""
    known = [pd.to_numeric(df["step"], errors="coerce") for df in (trace.layers, trace.comms) if len(df)]
    steps = pd.concat(known) if known else pd.Series(dtype=float)
    steps = steps[steps >= 0]
    return (float(steps.min()), float(steps.max())) if len(steps) else None


def _pieces(c: pd.DataFrame, st: pd.DataFrame) -> pd.DataFrame:
    """The pieces of each rank's collectives (their union) inside its rows' idle windows ([lo, hi]
    after the step, [start, lead_hi] before its first forward): the windows' time that is
    communication, not an input pipeline (the premise)."""
    out: list[tuple] = []
    by_rank = ByRank(c)
    for rank, rows in st.groupby("rank").indices.items():
        mine = by_rank[rank]
        if mine.empty:
            continue
        a = mine["ts"].to_numpy(dtype=float)
        b = a + mine["dur_s"].to_numpy(dtype=float) * NS
        order = np.argsort(a)
        starts, ends = _union(a[order], b[order])
        sub, steps = st.iloc[rows], st["step"].to_numpy()[rows]
        for which, (lo_col, hi_col) in enumerate((("lo", "hi"), ("start", "lead_hi"))):
            x, y = sub[lo_col].to_numpy(dtype=float), sub[hi_col].to_numpy(dtype=float)
            j0, j1 = np.searchsorted(ends, x, "right"), np.searchsorted(starts, y, "left")
            for i in np.flatnonzero((y > x) & (j1 > j0)):
                lo = np.maximum(starts[j0[i] : j1[i]], x[i])
                hi = np.minimum(ends[j0[i] : j1[i]], y[i])
                out.extend((rank, steps[i], which, s, e) for s, e in zip(lo, hi))
    return pd.DataFrame(out, columns=_PIECES)


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted intervals merged into disjoint ones."""
    s_out, e_out = [starts[0]], [ends[0]]
    for x, y in zip(starts[1:], ends[1:]):
        if x <= e_out[-1]:
            e_out[-1] = max(e_out[-1], y)
        else:
            s_out.append(x)
            e_out.append(y)
    return np.array(s_out), np.array(e_out)
