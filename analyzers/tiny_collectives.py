"""Many tiny collectives: latency, not bandwidth, bounds communication."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import config
from diag.analyzers.base import rule

from diag.findings import Finding, Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

TINY_BYTES = 64 * 1024
MIN_PER_STEP = 32  # tiny collectives per step (median over ranks and steps)
STEP_SHARE = 0.10  # and they take at least this share of the step


@rule("tiny_collectives")
def tiny_collectives(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a step issues >= 32 collectives under 64 KiB (barriers excluded) and they take >= 10%
    of the median step. Fix: larger reduce/allgather buckets, ZeRO-3 stage3_param_persistence_threshold
    (keep small parameters resident) and larger prefetch bucket, coalesce small tensors.
    recoverable_s: their time minus one bucketed collective's worth (the largest tiny op's time)."""
    c = metrics.comms
    if c.empty:
        return []
    # a size nothing recorded (NaN) is not tiny: without sizes the rule's premise is unmeasured
    tiny = (pd.to_numeric(c["bytes"], errors="coerce") < TINY_BYTES) & (c["kind"] != "barrier")
    per = metrics.comm_per_step(tiny)
    counts = c[tiny].groupby(["rank", "step"], observed=True).size().rename("n").reset_index()
    per = per.merge(counts, on=["rank", "step"], how="left").fillna({"n": 0})
    if per.empty:
        return []
    n, tiny_s, step_s = float(per["n"].median()), float(per["comm_s"].median()), float(per["dur_s"].median())
    if n < MIN_PER_STEP or step_s <= 0 or tiny_s / step_s < STEP_SHARE:
        return []
    rows = c[tiny]
    zero: dict[str, object] = {"reduce_bucket_size": int(5e8), "allgather_bucket_size": int(5e8)}
    if config.zero_stage(trace) == 3:
        thr = float(config.setting(trace, "stage3_param_persistence_threshold"))
        zero = {"stage3_param_persistence_threshold": int(max(thr * 10, 1e6)),
                "stage3_prefetch_bucket_size":
                    int(4 * float(config.setting(trace, "stage3_prefetch_bucket_size")))}
    return [Finding(
        severity="warning",
        title=f"{n:.0f} collectives under 64 KiB per step take {tiny_s / step_s:.0%} of it",
        detail=f"median {rows['bytes'].median():.0f} B each; latency-bound, not bandwidth-bound",
        evidence={"per_step": n, "tiny_s": tiny_s, "step_s": step_s,
                  "by_op": {str(k): int(v) for k, v in rows["kind"].value_counts().items()},
                  "median_bytes": float(rows["bytes"].median())},
        ranks=sorted(int(r) for r in rows["rank"].unique()),
        layers=[str(m) for m in rows["module"].dropna().astype(str).value_counts().index[:5]],
        recoverable_s=max(tiny_s - float(rows["dur_s"].max()), 0.0),
        fixes=[Fix("bucket small tensors into fewer, larger collectives",
                   ds_config={"zero_optimization": zero}),
               Fix("Megatron DDP: bucket gradients", megatron_args=["--ddp-bucket-size", "40000000"])])]
