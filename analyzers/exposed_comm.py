"""Exposed (non-overlapped) communication: the training thread blocks in collectives for much of a step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import common
from diag.analyzers.base import rule

from diag.findings import Finding, Fix
from diag.metrics import breakdown

if TYPE_CHECKING:
    from diag.trace.model import Trace

EXPOSED_SHARE = 0.40  # blocking communication as a share of the median step


def exposed_per_step(trace: Trace, waits: bool = False) -> pd.DataFrame:
    """Blocking (async_op false) communication seconds per (rank, step), joined to the step time;
    transfer time only, unless `waits` (then also the time spent waiting for late ranks)."""
    c = common.comms(trace)
    if not c.empty and not waits:
        c = c.assign(dur=common.transfer_dur(c))  # waiting for a straggler is not an overlap problem
    sync = c[~c["async_op"].fillna(False).astype(bool)] if not c.empty else c
    st = common.steady(common.steps(trace))
    if sync.empty or st.empty:
        return pd.DataFrame(columns=["rank", "step", "dur_s", "exposed_s"])
    return common.join_steps(trace, common.union_by_step(sync), "exposed_s")


def timeline_exposed(trace: Trace) -> pd.DataFrame | None:
    """GPU traces (Kineto kernels): communication not under compute kernels, from the metrics
    package's overlap figures, per rank over the whole profiled span (None without kernels)."""
    if trace.frame("kernel").empty:
        return None
    ov, span = breakdown.comm_overlap(trace), breakdown.temporal_breakdown(trace)
    ov = ov[ov["source"] == "gpu"].merge(span[["rank", "total_ns"]], on="rank")
    if ov.empty:
        return None
    return pd.DataFrame({"exposed_s": (ov["comm_ns"] - ov["overlap_ns"]).to_numpy() / common.NS,
                         "dur_s": ov["total_ns"].to_numpy() / common.NS}, index=ov["rank"].to_numpy())


def _fixes(trace: Trace) -> list[Fix]:
    stage = common.zero_stage(trace)
    zero: dict[str, object] = {"overlap_comm": True, "contiguous_gradients": True,
                               "reduce_bucket_size": int(common.setting(trace, "reduce_bucket_size"))}
    if stage == 3:
        prefetch = float(common.setting(trace, "stage3_prefetch_bucket_size"))
        zero["stage3_prefetch_bucket_size"] = int(4 * prefetch)
    else:
        zero["allgather_bucket_size"] = int(common.setting(trace, "allgather_bucket_size"))
    now = "on" if common.setting(trace, "overlap_comm") else "off (the code default below stage 3)"
    return [Fix(f"overlap gradient reduction with backward (overlap_comm is {now}) and reduce in large "
                "contiguous buckets", ds_config={"zero_optimization": zero}),
            Fix("Megatron's distributed optimizer: overlap grad reduce-scatter and param all-gather",
                megatron_args=["--overlap-grad-reduce", "--overlap-param-gather"])]


@rule("exposed_comm")
def exposed_comm(trace: Trace) -> list[Finding]:
    """Fires when blocking (non-async, hence not overlapped) communication covers >= 40% of the median
    step on some rank, counting each collective's transfer time (its shortest duration over the ranks:
    the time others spent waiting for a late rank is the straggler rule's business).
    Fix: overlap_comm true (DeepSpeed's code default is true only for stage 3),
    contiguous_gradients, bucket sizes, stage3_prefetch_bucket_size; Megatron --overlap-grad-reduce.
    recoverable_s: min(exposed, compute) per step: overlap can hide at most the compute time."""
    df = exposed_per_step(trace)
    med = timeline_exposed(trace)
    if med is None:
        if df.empty:
            return []
        med = df.groupby("rank")[["exposed_s", "dur_s"]].median()
    med["share"] = med["exposed_s"] / med["dur_s"]
    bad = med[med["share"] >= EXPOSED_SHARE]
    if bad.empty:
        return []
    worst = bad["share"].idxmax()
    exp_s, step_s = float(bad.loc[worst, "exposed_s"]), float(bad.loc[worst, "dur_s"])
    return [Finding(
        severity="warning",
        title=f"{exp_s / step_s:.0%} of each step waits on communication (rank {worst})",
        detail=(f"rank {worst} spends {exp_s * 1e3:.1f} ms of a {step_s * 1e3:.1f} ms step blocked in "
                "collectives that no compute overlaps."),
        evidence={"exposed_s": common.by_rank(med["exposed_s"]),
                  "step_s": common.by_rank(med["dur_s"]),
                  "exposed_share": common.by_rank(med["share"]),
                  "overlap_comm": bool(common.setting(trace, "overlap_comm"))},
        ranks=sorted(int(r) for r in bad.index),
        steps=sorted(int(s) for s in df["step"].unique())[:20] if not df.empty else [],
        recoverable_s=min(exp_s, step_s - exp_s), fixes=_fixes(trace))]
