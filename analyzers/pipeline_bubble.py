"""Pipeline bubble above the schedule's (p-1)/m: stages idle waiting for activations or gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diag.analyzers import config, evidence, framework
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix
from diag.vocab import P2P

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

TOLERANCE = 0.05  # measured bubble may exceed (p-1)/m by this much (timing noise)
MIN_BUBBLE = 0.10  # and must be at least this large to matter
SCHEDULE_LIMIT = 0.25  # (p-1)/m itself above this: too few microbatches


def microbatches(trace: Trace) -> int | None:
    """Microbatches per step as recorded (agent, ds_config, log's grad_accum or global / (micro x dp))."""
    for key in ("num_microbatches", "gradient_accumulation_steps", "grad_accum"):
        for h in trace.headers.values():
            if h.get(key):
                return int(h[key])
    got = config.ds_config(trace).get("gradient_accumulation_steps")
    if got:
        return int(got)
    lay = trace.layout()
    gb, mb, dp = lay.get("global_batch"), lay.get("micro_batch"), lay.get("dp")
    if gb and mb and dp and gb % (mb * dp) == 0:
        return int(gb // (mb * dp))
    return None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _fixes(trace: Trace, job: framework.Job, p: int, m: int) -> list[Fix]:
    """More microbatches, interleaved stages, balanced first/last stages: each only when it changes the
    job's setting and its framework has the knob (Megatron-DeepSpeed runs DeepSpeed's pipeline engine:
    no interleaving, no per-stage layer counts; its microbatches are gradient_accumulation_steps)."""
    fixes = []
    target = 4 * (p - 1)
    layers = _int(job.arg("num_layers"))
    if m < target:
        if job.framework == framework.MEGATRON_LM:
            micro, dp = _int(job.arg("micro_batch_size")), _int(trace.layout().get("dp"))
            if micro and dp and job.flags("--global-batch-size", "1"):
                fixes.append(
                    Fix(
                        f"raise microbatches per step from {m} to {target} (bubble (p-1)/m <= 0.25)",
                        megatron_args=job.flags("--global-batch-size", str(target * micro * dp)),
                    )
                )
        elif deepspeed_pipeline(trace):
            fixes.append(_more_microbatches(trace, job, p, m, target))
        elif job.deepspeed is not False:
            lead = "" if job.deepspeed else "if the job uses DeepSpeed: "
            fixes.append(
                Fix(
                    f"{lead}raise microbatches per step from {m} to {target} (bubble (p-1)/m "
                    "<= 0.25; keep the global batch by lowering train_micro_batch_size_per_gpu)",
                    ds_config={"gradient_accumulation_steps": target},
                )
            )
    if deepspeed_pipeline(trace):
        fixes.append(
            Fix(
                "balance the stages: PipelineModule(partition_method='parameters', or "
                "'type:<block class>') so the first and last stages, which also hold the embedding "
                "and the loss, get fewer blocks"
            )
        )
    interleaved = job.arg("num_layers_per_virtual_pipeline_stage")
    if job.framework == framework.MEGATRON_LM and layers and not interleaved:
        per_stage = layers // p
        if per_stage >= 2 and layers % p == 0 and job.flags("--num-layers-per-virtual-pipeline-stage", "1"):
            v = per_stage // 2 if per_stage % 2 == 0 else 1
            fixes.append(
                Fix(
                    f"interleave virtual stages: {per_stage} layers per stage in chunks of {v}",
                    megatron_args=job.flags("--num-layers-per-virtual-pipeline-stage", str(v)),
                )
            )
    if job.framework == framework.MEGATRON_LM and layers and p > 2 and layers % p == 0:
        per_stage = layers // p
        rest = layers - 2 * (per_stage - 1)
        if per_stage >= 2 and rest % (p - 2) == 0:
            args = (
                "--decoder-first-pipeline-num-layers",
                str(per_stage - 1),
                "--decoder-last-pipeline-num-layers",
                str(per_stage - 1),
            )
            if job.flags(*args):
                fixes.append(
                    Fix(
                        "balance stages: the first and last also hold the embedding and the loss",
                        megatron_args=job.flags(*args),
                    )
                )
    return fixes


def deepspeed_pipeline(trace: Trace) -> bool:
    """DeepSpeed's PipelineEngine runs the stages (also under Megatron-DeepSpeed): no interleaved
    schedule, no per-stage layer-count flags; its knobs are the micro-batch count and PipelineModule's
    partition_method."""
    return any(h.get("pipeline_engine") == "deepspeed" for h in trace.headers.values())


def _more_microbatches(trace: Trace, job: framework.Job, p: int, m: int, target: int) -> Fix:
    """m -> target micro-batches; the global batch (micro x m x dp) stays where the micro-batch divides,
    else train_batch_size grows with them (DeepSpeed checks train_batch_size = micro x accumulation x dp)."""
    cfg = config.ds_config(trace)
    micro, batch = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("train_batch_size")
    patch: dict[str, Any] = {"gradient_accumulation_steps": target}
    args: list[str] = []
    what = f"(p-1)/(m+p-1) {(p - 1) / (m + p - 1):.2f} -> {(p - 1) / (target + p - 1):.2f}"
    if micro and int(micro) * m % target == 0:
        patch["train_micro_batch_size_per_gpu"] = int(micro) * m // target
        args = job.flags("--micro-batch-size", str(patch["train_micro_batch_size_per_gpu"]))
        what += ", same global batch"
    elif batch:
        patch["train_batch_size"] = int(batch) // m * target
        what += f", global batch {batch} -> {patch['train_batch_size']}"
    return Fix(
        f"raise the pipeline's micro-batches per step from {m} to {target} ({what})",
        ds_config=patch,
        megatron_args=args,
    )


@rule("pipeline_bubble")
def pipeline_bubble(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires for pp > 1 when the measured bubble (time blocked in pipeline send/recv over the rest of
    the step, Megatron's definition) exceeds (p-1)/m + 0.05 and is >= 0.10, or when the schedule's own
    (p-1)/m >= 0.25 with a measured bubble >= 0.10. Fix, where it changes the job's setting and its
    framework has the knob: microbatches up to 4(p-1) (DeepSpeed gradient_accumulation_steps,
    Megatron-LM --global-batch-size); Megatron-LM only: --num-layers-per-virtual-pipeline-stage when a
    stage holds >= 2 layers, --decoder-first/last-pipeline-num-layers. recoverable_s: the excess over
    (p-1)/m times compute. Silent when the microbatch count m was not recorded. Severity: the bubble's
    share of the step (send/recv waits over the step)."""
    p, m = int(trace.layout().get("pp") or 1), microbatches(trace)
    if p <= 1 or m is None:  # the schedule's bubble (p-1)/m is the premise: unknown m, no verdict
        return []
    c = metrics.comms
    per = metrics.comm_per_step(c["kind"].isin(P2P)) if not c.empty else None
    if per is None or per.empty:
        return []
    per["bubble"] = per["comm_s"] / (per["dur_s"] - per["comm_s"]).clip(lower=1e-9)
    by_rank = per.groupby("rank")["bubble"].median()
    measured, ideal = float(by_rank.max()), (p - 1) / m
    if measured < MIN_BUBBLE or (measured <= ideal + TOLERANCE and ideal < SCHEDULE_LIMIT):
        return []
    step_s = float(per["dur_s"].median())
    compute = step_s / (1 + measured)
    cost = Cost(step_s - compute, step_s)
    return [
        Finding(
            severity=cost.severity,
            title=f"pipeline bubble {measured:.2f} vs the schedule's (p-1)/m = {ideal:.2f}",
            detail=(
                f"p={p} stages, m={m} microbatches; stages wait on send/recv for {measured:.0%} of compute: "
                f"the bubble {cost.text}."
            ),
            evidence={
                **cost.evidence(),
                "pp": p,
                "microbatches": m,
                "bubble_ideal": ideal,
                "bubble_measured": measured,
                "bubble_by_rank": evidence.by_rank(by_rank),
            },
            ranks=[
                int(r) for r in by_rank.index[by_rank >= max(MIN_BUBBLE, min(ideal + TOLERANCE, measured))]
            ],
            recoverable_s=max(measured - ideal, 0.0) * compute if measured > ideal else ideal / 2 * compute,
            fixes=_fixes(trace, framework.job_of(metrics), p, m),
        )
    ]
