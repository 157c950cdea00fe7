"""Exposed (non-overlapped) communication: the training thread blocks in collectives for much of a step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import config, evidence
from diag.analyzers.base import rule

from diag.findings import Finding, Fix
from diag.metrics.steps import NS

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

EXPOSED_SHARE = 0.40  # blocking communication as a share of the median step


def timeline_exposed(metrics: Metrics) -> pd.DataFrame | None:
    """GPU traces (Kineto kernels): communication not under compute kernels, from the overlap
    figures, per rank over the whole profiled span (None without kernels)."""
    if metrics.trace.frame("kernel").empty:
        return None
    ov, span = metrics.overlap, metrics.breakdown
    ov = ov[ov["source"] == "gpu"].merge(span[["rank", "total_ns"]], on="rank")
    if ov.empty:
        return None
    return pd.DataFrame({"exposed_s": (ov["comm_ns"] - ov["overlap_ns"]).to_numpy() / NS,
                         "dur_s": ov["total_ns"].to_numpy() / NS}, index=ov["rank"].to_numpy())


def _fixes(trace: Trace) -> list[Fix]:
    stage = config.zero_stage(trace)
    zero: dict[str, object] = {"overlap_comm": True, "contiguous_gradients": True,
                               "reduce_bucket_size": int(config.setting(trace, "reduce_bucket_size"))}
    if stage == 3:
        prefetch = float(config.setting(trace, "stage3_prefetch_bucket_size"))
        zero["stage3_prefetch_bucket_size"] = int(4 * prefetch)
    else:
        zero["allgather_bucket_size"] = int(config.setting(trace, "allgather_bucket_size"))
    now = "on" if config.setting(trace, "overlap_comm") else "off (the code default below stage 3)"
    return [Fix(f"overlap gradient reduction with backward (overlap_comm is {now}) and reduce in large "
                "contiguous buckets", ds_config={"zero_optimization": zero}),
            Fix("Megatron's distributed optimizer: overlap grad reduce-scatter and param all-gather",
                megatron_args=["--overlap-grad-reduce", "--overlap-param-gather"])]


@rule("exposed_comm")
def exposed_comm(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when blocking (non-async, hence not overlapped) communication covers >= 40% of the median
    step on some rank, counting each collective's transfer time (its shortest duration over the ranks:
    the time others spent waiting for a late rank is the straggler rule's business).
    Fix: overlap_comm true (DeepSpeed's code default is true only for stage 3),
    contiguous_gradients, bucket sizes, stage3_prefetch_bucket_size; Megatron --overlap-grad-reduce.
    recoverable_s: min(exposed, compute) per step: overlap can hide at most the compute time."""
    df = metrics.exposed
    med = timeline_exposed(metrics)
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
        evidence={"exposed_s": evidence.by_rank(med["exposed_s"]),
                  "step_s": evidence.by_rank(med["dur_s"]),
                  "exposed_share": evidence.by_rank(med["share"]),
                  "overlap_comm": bool(config.setting(trace, "overlap_comm"))},
        ranks=sorted(int(r) for r in bad.index),
        steps=sorted(int(s) for s in df["step"].unique())[:20] if not df.empty else [],
        recoverable_s=min(exp_s, step_s - exp_s), fixes=_fixes(trace))]
