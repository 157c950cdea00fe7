"""Many tiny collectives: latency, not bandwidth, bounds communication."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import config, framework
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix
from diag.metrics.comms import activations
from diag.metrics.steps import join_steps

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

TINY_BYTES = 64 * 1024
MIN_PER_STEP = 32  # tiny collectives per step (median over ranks and steps)
STEP_SHARE = 0.10  # and they take at least this share of the step


def _fixes(trace: Trace, job: framework.Job) -> list[Fix]:
    """Bucketing advice only where it changes the job's setting: ZeRO-3's persistence threshold and
    prefetch bucket (from the current values); stage 1/2 gradient buckets only when DP > 1 and the
    bucket is below DeepSpeed's default (at the default, tiny ops are not gradient buckets: TP or
    per-parameter traffic no bucket size changes)."""
    if job.deepspeed is False:
        return []
    lead = "" if job.deepspeed else "if the job uses DeepSpeed ZeRO: "
    if config.zero_stage(trace) == 3:
        thr = float(config.setting(trace, "stage3_param_persistence_threshold"))
        prefetch = float(config.setting(trace, "stage3_prefetch_bucket_size"))
        return [
            Fix(
                f"{lead}keep small parameters resident (persistence threshold {thr:.0e} -> "
                f"{max(thr * 10, 1e6):.0e}) and prefetch in larger buckets",
                ds_config={
                    "zero_optimization": {
                        "stage3_param_persistence_threshold": int(max(thr * 10, 1e6)),
                        "stage3_prefetch_bucket_size": int(
                            4 * prefetch
                            if prefetch > 0
                            else config.DS_DEFAULTS["stage3_prefetch_bucket_size"]
                        ),
                    }
                },
            )
        ]
    if trace.layout().get("dp") == 1:
        return []
    zero: dict[str, object] = {}
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        now = float(config.setting(trace, key))
        if now < float(config.DS_DEFAULTS[key]):
            zero[key] = int(min(4 * now, float(config.DS_DEFAULTS[key])))
    if not zero:
        return []
    return [
        Fix(f"{lead}bucket gradients into fewer, larger collectives", ds_config={"zero_optimization": zero})
    ]


def _tiny(c: pd.DataFrame) -> pd.Series:
    """Collectives under 64 KiB that a bucket could merge: sizes recorded (traces without size fields,
    some Kineto, say 0 or nothing), barriers and tensor- and sequence-parallel groups' activations
    left out: no bucket merges them (Megatron-DeepSpeed TP=2, hidden 64: 26 all-reduces of 8 KiB a
    step, "latency-bound" with no fix; Ulysses SP=2 under ZeRO-3: its 16 attention all-to-alls a step
    led the finding whose fix was ZeRO-3's buckets); exposed_comm measures them."""
    size = c["bytes"].astype(float)
    known = size.notna() & (size > 0)
    return known & (size < TINY_BYTES) & (c["kind"] != "barrier") & ~activations(c["group"])


@rule("tiny_collectives")
def tiny_collectives(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a step issues >= 32 collectives under 64 KiB (barriers and tensor- and
    sequence-parallel groups' activations excluded) and they take >= 10% of the median step; silent
    when the trace records no collective sizes. Fix (DeepSpeed jobs; only changes to the current
    values): ZeRO-3 stage3_param_persistence_threshold x10 and 4x prefetch bucket; stage 1/2 with DP > 1:
    reduce/allgather buckets raised toward DeepSpeed's default when below.
    recoverable_s: their time minus one bucketed collective's worth (the largest tiny op's time).
    Severity: their share of the median step."""
    sel = metrics.select(_tiny)  # what the finding reads of them
    if sel.calls < MIN_PER_STEP:  # no step can hold that many: the per-step tables are moot
        return []
    per = join_steps(metrics.steady_steps, sel.sums, "comm_s")
    per = per.merge(sel.counts.rename("n").reset_index(), on=["rank", "step"], how="left").fillna({"n": 0})
    if per.empty:
        return []
    n, tiny_s, step_s = float(per["n"].median()), float(per["comm_s"].median()), float(per["dur_s"].median())
    if n < MIN_PER_STEP or step_s <= 0 or tiny_s / step_s < STEP_SHARE:
        return []
    cost = Cost(tiny_s, step_s)
    return [
        Finding(
            severity=cost.severity,
            title=f"{n:.0f} collectives under 64 KiB per step take {cost.share:.0%} of it",
            detail=(
                f"median {sel.median_bytes():.0f} B each; latency-bound, not bandwidth-bound; "
                f"together this {cost.text}"
            ),
            evidence={
                **cost.evidence(),
                "per_step": n,
                "tiny_s": tiny_s,
                "step_s": step_s,
                "by_op": sel.ops(),
                "median_bytes": sel.median_bytes(),
            },
            ranks=sorted(sel.ranks),
            layers=sel.top_modules(5),
            recoverable_s=max(tiny_s - sel.max_dur_s, 0.0),
            fixes=_fixes(trace, framework.job_of(metrics)),
        )
    ]
