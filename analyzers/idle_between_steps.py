"""Idle accelerator between steps: the next batch is not ready (data loader, host-side work)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from diag.analyzers import evidence, framework
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix
from diag.metrics.activity import ByRank
from diag.metrics.steps import NS, steady

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

GAP_SHARE = 0.15  # median gap / (step + gap)
MIN_GAP_S = 0.005  # and at least 5 ms
MIN_STEPS = 3  # a rank is judged on at least this many measured steps: one sampled step (layers every
# 50 steps) is one descheduling under load (15 ms once in a fault-matrix run at load 9), not an input
# pipeline, which is late on every step


def gaps(metrics: Metrics) -> pd.DataFrame:
    """Per (rank, step): idle seconds before the step's work: the gap after the previous step's end
    plus, where per-layer records exist (sampled steps), the lead-in from the step's start (the
    previous optimizer step's end) to its first forward. Steps recorded boundary to boundary have no
    gap, so the lead-in is where a slow data loader shows."""
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


@rule("idle_between_steps")
def idle_between_steps(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when the median idle time before a step's work (the gap between steps plus the lead-in
    to the first forward, less the time the rank spent in collectives there: that is communication,
    not input) is >= 15% of the step's wall time (step + gap) and >= 5 ms on some rank: the
    accelerator idles while the host prepares data; each rank judged on >= 3 measured steps (where
    per-layer records exist, the sampled ones). Fix: DataLoader num_workers / pin_memory /
    prefetch_factor / persistent_workers; Megatron --num-workers above its current value.
    recoverable_s: the median idle time. Severity: the worst rank's idle share of its wall time."""
    g = gaps(metrics)
    if g.empty:
        return []
    g = g.assign(gap_s=(g["gap_s"] - g["comm_gap_s"]).clip(lower=0))  # collectives are not input time
    g = g[g.groupby("rank")["step"].transform("size") >= MIN_STEPS]
    if g.empty:
        return []
    med = g.groupby("rank")[["gap_s", "wall_s", "comm_gap_s"]].median()
    med["share"] = med["gap_s"] / med["wall_s"]
    bad = med[(med["share"] >= GAP_SHARE) & (med["gap_s"] >= MIN_GAP_S)]
    if bad.empty:
        return []
    gap = float(bad["gap_s"].median())
    worst = bad["share"].idxmax()
    cost = Cost(float(bad.loc[worst, "gap_s"]), float(bad.loc[worst, "wall_s"]))
    return [
        Finding(
            severity=cost.severity,
            title=f"{cost.share:.0%} of wall time idles between steps ({gap * 1e3:.1f} ms per step)",
            detail=(
                "nothing runs between one optimizer step and the next forward: the input pipeline is "
                f"late; on rank {worst} this {cost.text}"
            ),
            evidence={
                **cost.evidence(),
                "gap_s": evidence.by_rank(med["gap_s"]),
                "gap_share": evidence.by_rank(med["share"]),
                "collectives_in_gap_s": evidence.by_rank(med["comm_gap_s"]),
            },
            ranks=sorted(int(r) for r in bad.index),
            recoverable_s=gap,
            fixes=_fixes(framework.job_of(metrics)),
        )
    ]


def _fixes(job: framework.Job) -> list[Fix]:
    fixes = [
        Fix(
            "prefetch batches in background workers: DataLoader(num_workers=4, pin_memory=True, "
            "prefetch_factor=4, persistent_workers=True)"
        )
    ]
    if job.megatron:
        now = job.arg("num_workers")
        if isinstance(now, int) and not isinstance(now, bool):
            args = job.flags("--num-workers", str(max(2 * now, 4)))
            if args:
                fixes = [
                    Fix(
                        f"more data-loader workers: --num-workers {now} -> {max(2 * now, 4)}",
                        megatron_args=args,
                    )
                ]
        elif job.flags("--num-workers", "4"):
            fixes = [
                Fix(
                    "if --num-workers is below 4 (Megatron's default is 2), raise it",
                    megatron_args=job.flags("--num-workers", "4"),
                )
            ]
    return fixes
