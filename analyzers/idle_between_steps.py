"""Idle accelerator between steps: the next batch is not ready (data loader, host-side work)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import evidence
from diag.analyzers.base import rule

from diag.findings import Finding, Fix
from diag.metrics.steps import NS, steady

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

GAP_SHARE = 0.15  # median gap / (step + gap)
MIN_GAP_S = 0.005  # and at least 5 ms


def gaps(metrics: Metrics) -> pd.DataFrame:
    """Per (rank, step): idle seconds before the step's work: the gap after the previous step's end
    plus, where per-layer records exist (sampled steps), the lead-in from the step's start (the
    previous optimizer step's end) to its first forward. Steps recorded boundary to boundary have no
    gap, so the lead-in is where a slow data loader shows."""
    st = metrics.steps
    if st.empty:
        return st.assign(gap_s=pd.Series(dtype=float), wall_s=pd.Series(dtype=float))
    nxt = st.groupby("rank")["start"].shift(-1)
    between = ((nxt - st["end"]) / NS).fillna(0).clip(lower=0)
    st = st.assign(gap_s=between, wall_s=st["dur_s"] + between)
    lay = metrics.trace.layers
    if not lay.empty:
        fwd = lay[lay["phase"].astype(str) == "fwd"]
        first = fwd.groupby(["rank", "step"], observed=True)["ts"].min().rename("first").reset_index()
        st = st.merge(first, on=["rank", "step"], how="left")
        lead = ((st["first"] - st["start"]) / NS).where(st["first"] < st["end"]).clip(lower=0)
        st["gap_s"] = st["gap_s"] + lead.fillna(0)
        st = st[st["first"].notna()] if st["first"].notna().any() else st
    return steady(st)


@rule("idle_between_steps")
def idle_between_steps(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when the median idle time before a step's work (the gap between steps plus the lead-in
    to the first forward) is >= 15% of the step's wall time (step + gap) and >= 5 ms on some rank: the
    accelerator idles while the host prepares data. Fix: DataLoader num_workers / pin_memory /
    prefetch_factor / persistent_workers; Megatron --num-workers; move host-side logging or checkpoint
    work off the step. recoverable_s: the median idle time."""
    g = gaps(metrics)
    if g.empty:
        return []
    med = g.groupby("rank")[["gap_s", "wall_s"]].median()
    med["share"] = med["gap_s"] / med["wall_s"]
    bad = med[(med["share"] >= GAP_SHARE) & (med["gap_s"] >= MIN_GAP_S)]
    if bad.empty:
        return []
    gap = float(bad["gap_s"].median())
    return [Finding(
        severity="warning",
        title=f"{bad['share'].max():.0%} of wall time idles between steps ({gap * 1e3:.1f} ms per step)",
        detail="nothing runs between one optimizer step and the next forward: the input pipeline is late",
        evidence={"gap_s": evidence.by_rank(med["gap_s"]),
                  "gap_share": evidence.by_rank(med["share"])},
        ranks=sorted(int(r) for r in bad.index), recoverable_s=gap,
        fixes=[Fix("prefetch batches in background workers: DataLoader(num_workers=4, pin_memory=True, "
                   "prefetch_factor=4, persistent_workers=True)", megatron_args=["--num-workers", "4"])])]
