"""Idle time before each step's work, per (rank, step): the gap after the previous step plus, on
sampled steps (per-layer records), the lead-in to the first forward, less the time spent in
collectives there. Read by idle_between_steps (an input stall) and straggler (which defers to it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diag.metrics import input_wait
from diag.metrics.activity import ByRank
from diag.metrics.steps import NS, steady

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics


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
    nxt = st.groupby("rank")["start"].shift(-1)
    between = ((nxt - st["end"]) / NS).fillna(0).clip(lower=0)
    st = st.assign(gap_s=between, wall_s=st["dur_s"] + between, lo=st["end"], hi=nxt.fillna(st["end"]))
    lay = metrics.trace.layers
    if not lay.empty:
        fwd = lay[lay["phase"].astype(str) == "fwd"]
        first = fwd.groupby(["rank", "step"], observed=True)["ts"].min().rename("first").reset_index()
        st = st.merge(first, on=["rank", "step"], how="left")
        lead = ((st["first"] - st["start"]) / NS).where(st["first"] < st["end"]).clip(lower=0)
        st["gap_s"] = st["gap_s"] + lead.fillna(0)
        st["lead_hi"] = st["first"].where(lead.notna(), st["start"])
        st = st[st["first"].notna()] if st["first"].notna().any() else st
    else:
        st = st.assign(lead_hi=st["start"])
        ops = metrics.trace.frame("cpu_op")
        if not ops.empty:  # a profiler trace: its steps hold the batch's fetch (`input_wait`)
            waits = input_wait.loader_idle(ops, metrics.trace.frame("kernel"), st)
            st = st.assign(gap_s=st["gap_s"] + waits, loader_s=waits)
    st = st.assign(comm_gap_s=_comm_within(metrics, st))
    return steady(st)


def _comm_within(metrics: Metrics, st: pd.DataFrame) -> np.ndarray:
    """Seconds of each row's idle windows ([end, next start] and [start, first forward]) that its rank
    spent in collectives: that time is communication, not an input pipeline (the premise)."""
    out = np.zeros(len(st))
    c = metrics.comms
    if c.empty or "ts" not in c:
        return out
    by_rank = ByRank(c)
    for rank, rows in st.groupby("rank").indices.items():
        mine = by_rank[rank]
        if mine.empty:
            continue
        a = mine["ts"].to_numpy(dtype=float)
        b = a + mine["dur_s"].to_numpy(dtype=float) * NS
        order = np.argsort(a)
        starts, ends = _union(a[order], b[order])
        sub = st.iloc[rows]
        for lo_col, hi_col in (("lo", "hi"), ("start", "lead_hi")):
            lo, hi = sub[lo_col].to_numpy(dtype=float), sub[hi_col].to_numpy(dtype=float)
            for i, (x, y) in enumerate(zip(lo, hi)):
                if not y > x:
                    continue
                j0, j1 = np.searchsorted(ends, x, "right"), np.searchsorted(starts, y, "left")
                if j1 > j0:
                    busy = np.minimum(ends[j0:j1], y) - np.maximum(starts[j0:j1], x)
                    out[rows[i]] += float(busy.sum()) / NS
    return out


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
