"""Exposed (non-overlapped) communication: the training thread blocks in collectives for much of a step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import config, evidence, framework
from diag.analyzers.base import rule
from diag.analyzers.cross_node import zero3_cross_node

from diag.findings import Cost, Finding, Fix
from diag.metrics import comms
from diag.metrics.steps import NS
from diag.ranks import rank_name
from diag.vocab import P2P

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

EXPOSED_SHARE = 0.40  # blocking communication as a share of the median step
DEFER_SHARE = 0.5  # ZeRO-3's slow cross-node gathers at least this share of it: zero3_slow_link's
MIN_STEPS = 5  # steady steps a rank's median needs: a live trace's first steps (gloo connecting, the
# warm-up kept while a rank has 2 steps) are not the job's steady state


def timeline_exposed(metrics: Metrics) -> pd.DataFrame | None:
    """GPU traces (Kineto kernels): communication not under compute kernels, from the overlap
    figures, per rank over the whole profiled span (None without kernels)."""
    if metrics.trace.frame("kernel").empty:
        return None
    ov, span = metrics.overlap, metrics.breakdown
    ov = ov[ov["source"] == "gpu"].merge(span[["rank", "total_ns"]], on="rank")
    if ov.empty:
        return None
    return pd.DataFrame(
        {
            "exposed_s": (ov["comm_ns"] - ov["overlap_ns"]).to_numpy() / NS,
            "dur_s": ov["total_ns"].to_numpy() / NS,
        },
        index=ov["rank"].to_numpy(),
    )


def _fixes(trace: Trace, job: framework.Job) -> list[Fix]:
    """Only changes to what the job runs: DeepSpeed's ZeRO overlap where DeepSpeed runs it and
    gradients are reduced over data parallelism (DP > 1), Megatron-LM's overlap flags it has not set.
    Megatron-DeepSpeed has no such flags and keeps TP all-reduces synchronous under DeepSpeed."""
    fixes = []
    dp = trace.layout().get("dp")
    if job.deepspeed is not False and dp != 1:
        stage = config.zero_stage(trace)
        zero: dict[str, object] = {}
        overlap = config.setting(trace, "overlap_comm")
        if not overlap:
            zero["overlap_comm"] = True
        if stage == 3:
            prefetch = float(config.setting(trace, "stage3_prefetch_bucket_size"))
            zero["stage3_prefetch_bucket_size"] = int(
                4 * prefetch if prefetch > 0 else config.DS_DEFAULTS["stage3_prefetch_bucket_size"]
            )
        if zero:
            if job.config_seen:
                now = "on" if overlap else "off"
                what = f"overlap_comm is {now}"
            else:
                what = "no DeepSpeed config was recorded: this applies if overlap_comm is off"
            lead = "" if job.deepspeed else "if the job uses DeepSpeed ZeRO: "
            fixes.append(
                Fix(
                    f"{lead}overlap gradient reduction with backward ({what})",
                    ds_config={"zero_optimization": zero},
                )
            )
    if job.framework == framework.MEGATRON_LM:
        args = [f for f in ("--overlap-grad-reduce", "--overlap-param-gather") if not job.arg(f)]
        if "--overlap-param-gather" in args and not job.arg("use_distributed_optimizer"):
            args.remove("--overlap-param-gather")  # it needs the distributed optimizer
        if args and job.flags(*args):
            fixes.append(
                Fix(
                    "Megatron-LM: overlap the data-parallel gradient reduction (and, with the "
                    "distributed optimizer, the parameter all-gather) with compute",
                    megatron_args=job.flags(*args),
                )
            )
    return fixes


@rule("exposed_comm")
def exposed_comm(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when blocking (non-async, hence not overlapped) communication covers >= 40% of the median
    step on some rank, counting each collective's transfer time (its shortest duration over the ranks:
    the time others spent waiting for a late rank is the straggler rule's business; with pp > 1 the
    pipeline's send/recv are left to pipeline_bubble).
    Fix, only where it changes the job's setting and exists in its framework: DeepSpeed overlap_comm
    (its code default is true only for stage 3) and 4x stage3_prefetch_bucket_size when DP > 1;
    Megatron-LM --overlap-grad-reduce / --overlap-param-gather (not Megatron-DeepSpeed: it lacks them).
    recoverable_s: min(exposed, compute) per step: overlap can hide at most the compute time.
    Severity: the exposed share of the step (`diag.findings.severity_of`). Not when ZeRO-3's
    cross-node gathers run slow (zero3_slow_link's premise) and make >= 50% (DEFER_SHARE = 0.5) of
    the exposed time: that fault is zero3_slow_link's, with its fixes. From diag's records, a rank's
    median is taken over >= 5 steady steps (MIN_STEPS)."""
    df = metrics.exposed
    if int(trace.layout().get("pp") or 1) > 1 and not metrics.comms.empty:
        # a pipeline's send/recv waits are its bubble (pipeline_bubble's premise), not un-overlapped
        # gradient or TP traffic: counted there, not here
        c = metrics.comms
        df = comms.blocking_per_step(c[~c["kind"].isin(P2P)], metrics.steady_steps, waits=False)
    med = timeline_exposed(metrics)
    if med is None:
        df = df.dropna(subset=["exposed_s"])  # steps whose transfer times are not all known yet
        if df.empty:
            return []
        counted = df.groupby("rank")["step"].transform("size")
        med = df[counted >= MIN_STEPS].groupby("rank")[["exposed_s", "dur_s"]].median()
    med["share"] = med["exposed_s"] / med["dur_s"]
    bad = med[med["share"] >= EXPOSED_SHARE]
    if bad.empty:
        return []
    worst = bad["share"].idxmax()
    exp_s, step_s = float(bad.loc[worst, "exposed_s"]), float(bad.loc[worst, "dur_s"])
    slow = zero3_cross_node(trace, metrics)
    if slow is not None and slow.slow and slow.cross_s >= DEFER_SHARE * exp_s:
        return []  # ZeRO-3's gathers over a slow link are most of it: zero3_slow_link names that fault
    cost = Cost(exp_s, step_s)
    return [
        Finding(
            severity=cost.severity,
            title=f"{cost.share:.0%} of each step waits on communication ({rank_name(worst)})",
            detail=f"{rank_name(worst)} is blocked in collectives no compute overlaps: this {cost.text}.",
            evidence={
                **cost.evidence(),
                "exposed_s": evidence.by_rank(med["exposed_s"]),
                "step_s": evidence.by_rank(med["dur_s"]),
                "exposed_share": evidence.by_rank(med["share"]),
                "overlap_comm": bool(config.setting(trace, "overlap_comm")),
            },
            ranks=sorted(int(r) for r in bad.index),
            steps=sorted(int(s) for s in df["step"].unique())[:20] if not df.empty else [],
            recoverable_s=min(exp_s, step_s - exp_s),
            fixes=_fixes(trace, framework.job_of(metrics)),
        )
    ]
