"""Exposed (non-overlapped) communication: the training thread blocks in collectives for much of a step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from diag.analyzers import config, evidence, framework
from diag.analyzers.base import rule
from diag.analyzers.cross_node import on_gpu, zero3_cross_node

from diag.findings import Cost, Finding, Fix
from diag.metrics import reduction
from diag.metrics.comms import tensor_parallel
from diag.metrics.exposure import Exposed
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
    if job.framework == framework.MEGATRON_LM and dp != 1:  # no data-parallel reduction to overlap
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


def _tp_fixes(trace: Trace, job: framework.Job) -> tuple[list[Fix], bool]:
    """(the settings that overlap tensor-parallel communication with compute where the job lacks
    them, whether they hide all of it). On GPUs only (both rely on CUDA streams):
    - Megatron-LM: --tp-comm-overlap (Transformer Engine's userbuffers; needs --sequence-parallel)
      overlaps the TP all-gathers / reduce-scatters with the GEMMs, forward and backward;
    - Megatron-DeepSpeed: none for its all-reduces (it turns its async TP all-reduce off under
      --deepspeed); --sequence-parallel makes the column-parallel layers' backward all-gather and
      reduce-scatter async, overlapped with their GEMMs (CUDA_DEVICE_MAX_CONNECTIONS=1): a part.
    On CPU (gloo) neither applies: the job has no setting."""
    if not on_gpu(trace):
        return [], False
    if job.framework == framework.MEGATRON_LM and job.arg("transformer_impl") != "local":
        args = [f for f in ("--sequence-parallel", "--tp-comm-overlap") if not job.arg(f)]
        if job.arg("tp_comm_overlap") or not job.flags(*args):
            return [], False
        summary = (
            "Megatron-LM with Transformer Engine: overlap the tensor-parallel all-gather / "
            "reduce-scatter with the linear layers' GEMMs (needs sequence parallelism)"
        )
        return [Fix(summary, megatron_args=job.flags(*args))], True
    if job.framework == framework.MEGATRON_DEEPSPEED and not job.arg("sequence_parallel"):
        args = job.flags("--sequence-parallel")
        if not args:
            return [], False
        summary = (
            "Megatron-DeepSpeed on GPUs: sequence parallelism makes the column-parallel layers' "
            "backward all-gather / reduce-scatter async, overlapped with their GEMMs (the forward's "
            "and the row-parallel layers' stay blocking)"
        )
        return [Fix(summary, megatron_args=args, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})], False
    return [], False


def _medians(df: pd.DataFrame) -> pd.DataFrame:
    """Per rank: median exposed seconds and step seconds over >= MIN_STEPS steps whose transfer
    times are all known, with `share`."""
    df = df.dropna(subset=["exposed_s"])  # steps whose transfer times are not all known yet
    counted = df.groupby("rank")["step"].transform("size")
    med = df[counted >= MIN_STEPS].groupby("rank")[["exposed_s", "dur_s"]].median()
    return med.assign(share=med["exposed_s"] / med["dur_s"])


def _split(trace: Trace, metrics: Metrics) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(per steady (rank, step): blocking transfer seconds of the collectives an overlap setting
    can hide; the same of tensor-parallel groups' collectives, None without any). With pp > 1 the
    pipeline's send/recv are left out: their waits are its bubble (pipeline_bubble's premise)."""
    if not metrics.calls:
        return metrics.exposed, None
    pp = int(trace.layout().get("pp") or 1) > 1
    roles = metrics.reduce(_Roles())
    hideable = all(not tp and not (pp and p2p) for tp, p2p in roles)  # every call: `exposed` is theirs
    rest = metrics.exposed if hideable else Exposed(_Hideable(pp)).per_step(metrics)
    return rest, Exposed(_in_tp_group).per_step(metrics) if any(tp for tp, _ in roles) else None


@dataclass(frozen=True)
class _Roles:
    """The (tensor-parallel, send/recv) pairs the calls hold (`diag.metrics.reduction`): whether
    some are measured apart, and whether those an overlap setting hides are all of them."""

    def of(self, metrics: Metrics) -> frozenset[tuple[bool, bool]]:
        c = metrics.comms
        if c.empty:
            return frozenset()
        tp = tensor_parallel(c["group"]).to_numpy(dtype=bool)
        p2p = c["kind"].isin(P2P).to_numpy(dtype=bool)
        return frozenset((bool(code & 2), bool(code & 1)) for code in np.unique(2 * tp + p2p))

    def merged(self, parts: list[frozenset[tuple[bool, bool]]]) -> frozenset[tuple[bool, bool]]:
        return frozenset().union(*parts)

    folds = True  # (its merged value is a part: a set)


def _in_tp_group(c: pd.DataFrame) -> pd.Series:
    """Tensor-parallel groups' calls (`comms.tensor_parallel`)."""
    return tensor_parallel(c["group"])


@dataclass(frozen=True)
class _Hideable:
    """The calls an overlap setting can hide: not tensor-parallel, nor (`pp`) the pipeline's
    send/recv."""

    pp: bool

    def __call__(self, c: pd.DataFrame) -> pd.Series:
        keep = ~tensor_parallel(c["group"])
        return keep & ~c["kind"].isin(P2P) if self.pp else keep


@rule("exposed_comm")
def exposed_comm(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when blocking (non-async, hence not overlapped) communication covers >= 40% of the median
    step on some rank, counting each collective's transfer time (its shortest duration over the ranks:
    the time others spent waiting for a late rank is the straggler rule's business; with pp > 1 the
    pipeline's send/recv are left to pipeline_bubble; a rank alone in its group moves nothing).
    Tensor-parallel groups' collectives (`tp:N`) are measured apart: Megatron reduces a layer's
    activations where the next op needs them, blocking by design, and no data-parallel overlap
    setting hides them. Their share >= 40% is a finding of its own, priced by its share where the
    job can overlap them (Megatron-LM with Transformer Engine on GPUs: --sequence-parallel
    --tp-comm-overlap), else info with no fix (Megatron-DeepSpeed has no such setting: the lever is
    a narrower tensor-parallel size, or faster links between its ranks).
    Fix, only where it changes the job's setting and exists in its framework: DeepSpeed overlap_comm
    (its code default is true only for stage 3) and 4x stage3_prefetch_bucket_size when DP > 1;
    Megatron-LM --overlap-grad-reduce / --overlap-param-gather (not Megatron-DeepSpeed: it lacks them).
    recoverable_s: min(exposed, compute) per step: overlap can hide at most the compute time.
    Severity: the exposed share of the step (`diag.findings.severity_of`). Not when ZeRO-3's
    cross-node gathers run slow (zero3_slow_link's premise) and make >= 50% (DEFER_SHARE = 0.5) of
    the exposed time: that fault is zero3_slow_link's, with its fixes. From diag's records, a rank's
    median is taken over >= 5 steady steps (MIN_STEPS)."""
    tp_med = None
    med = timeline_exposed(metrics)
    if med is None:
        df, tp_df = _split(trace, metrics)
        df = df.dropna(subset=["exposed_s"])  # steps whose transfer times are not all known yet
        med = _medians(df)
        tp_med = _medians(tp_df) if tp_df is not None else None
    else:
        df = metrics.exposed  # the steps it names
        med["share"] = med["exposed_s"] / med["dur_s"]
    out = _hideable(trace, metrics, med, df, tp_med)
    if tp_med is not None and not tp_med.empty:
        out += _tensor_parallel(trace, metrics, tp_med)
    return out


def _worst(med: pd.DataFrame) -> tuple[pd.DataFrame, Any, float, float] | None:
    """(the ranks at or over the share, the worst one, its exposed and step seconds); None: none."""
    bad = med[med["share"] >= EXPOSED_SHARE]
    if bad.empty:
        return None
    worst = bad["share"].idxmax()
    return bad, worst, float(bad.loc[worst, "exposed_s"]), float(bad.loc[worst, "dur_s"])


def _hideable(
    trace: Trace, metrics: Metrics, med: pd.DataFrame, df: pd.DataFrame, tp_med: pd.DataFrame | None
) -> list[Finding]:
    """The finding on the communication an overlap setting can hide (`med`: per-rank medians)."""
    found = _worst(med)
    if found is None:
        return []
    bad, worst, exp_s, step_s = found
    slow = zero3_cross_node(trace, metrics)
    if slow is not None and slow.slow and slow.cross_s >= DEFER_SHARE * exp_s:
        return []  # ZeRO-3's gathers over a slow link are most of it: zero3_slow_link names that fault
    cost = Cost(exp_s, step_s)
    tp = {"tp_exposed_s": evidence.by_rank(tp_med["exposed_s"])} if tp_med is not None else {}
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
                **tp,
            },
            ranks=sorted(int(r) for r in bad.index),
            steps=sorted(int(s) for s in df["step"].unique())[:20] if not df.empty else [],
            recoverable_s=min(exp_s, step_s - exp_s),
            fixes=_fixes(trace, framework.job_of(metrics)),
        )
    ]


def _tensor_parallel(trace: Trace, metrics: Metrics, med: pd.DataFrame) -> list[Finding]:
    """The finding on tensor-parallel groups' blocking collectives (`med`: per-rank medians):
    priced by its share where a setting overlaps them all, at most warning where one overlaps a
    part, else info."""
    found = _worst(med)
    if found is None:
        return []
    bad, worst, exp_s, step_s = found
    cost = Cost(exp_s, step_s)
    job = framework.job_of(metrics)
    fixes, whole = _tp_fixes(trace, job)
    severity = cost.severity if whole else "warning" if fixes else "info"
    tp = trace.layout().get("tp")
    return [
        Finding(
            severity=severity,
            title=f"tensor-parallel collectives take {cost.share:.0%} of each step ({rank_name(worst)})",
            detail=(
                f"{rank_name(worst)} blocks in its tensor-parallel group's collectives: this {cost.text}. "
                f"Megatron reduces a layer's activations where the next op needs them, by design; "
                f"{_tp_why(job, tp, fixes, whole)}."
            ),
            evidence={
                **cost.evidence(),
                "tp_exposed_s": evidence.by_rank(med["exposed_s"]),
                "step_s": evidence.by_rank(med["dur_s"]),
                "tp_exposed_share": evidence.by_rank(med["share"]),
                "tp": tp,
            },
            ranks=sorted(int(r) for r in bad.index),
            # overlap hides at most the compute; a part of it: not measured how much
            recoverable_s=min(exp_s, step_s - exp_s) if whole else None,
            fixes=fixes,
        )
    ]


def _tp_why(job: framework.Job, tp: object, fixes: list[Fix], whole: bool) -> str:
    """What the job can do about its tensor-parallel collectives, said plainly."""
    width = f"TP={tp}" if tp else "tensor parallelism"
    narrower = (
        f"their cost is {width}'s: a narrower tensor-parallel size where the model fits, or faster "
        "links between its ranks, cut it"
    )
    if whole:
        return "Megatron-LM overlaps them with the GEMMs under Transformer Engine (below)"
    if fixes:
        return f"sequence parallelism overlaps a part of them (below); for the rest, {narrower}"
    how = (
        " (Megatron-DeepSpeed runs its TP all-reduces synchronously under DeepSpeed; its sequence "
        "parallelism overlaps a part, on GPUs)"
        if job.framework == framework.MEGATRON_DEEPSPEED
        else ""
    )
    return f"the job has no setting that overlaps them{how}; {narrower}"


# what the rule asks first: computed in the windowed pass's first pass (`reduction.early`)
reduction.early(lambda _trace: _Roles())
