"""Pipeline bubble above the schedule's (p-1)/m: stages idle waiting for activations or gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diag.analyzers import config, evidence
from diag.analyzers.base import rule

from diag.findings import Finding, Fix
from diag.vocab import P2P

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

TOLERANCE = 0.05  # measured bubble may exceed (p-1)/m by this much (timing noise)
MIN_BUBBLE = 0.10  # and must be at least this large to matter
SCHEDULE_LIMIT = 0.25  # (p-1)/m itself above this: too few microbatches


def microbatches(trace: Trace) -> int:
    for key in ("num_microbatches", "gradient_accumulation_steps"):
        for h in trace.headers.values():
            if h.get(key):
                return int(h[key])
    return int(config.ds_config(trace).get("gradient_accumulation_steps") or 1)


@rule("pipeline_bubble")
def pipeline_bubble(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires for pp > 1 when the measured bubble (time blocked in pipeline send/recv over the rest of
    the step, Megatron's definition) exceeds (p-1)/m + 0.05 and is >= 0.10, or when the schedule's own
    (p-1)/m >= 0.25 with a measured bubble >= 0.10. Fix: more microbatches (m), interleaved schedule
    (virtual stages), balanced stages. recoverable_s: the excess over (p-1)/m times compute."""
    p, m = int(trace.layout().get("pp") or 1), microbatches(trace)
    if p <= 1:
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
    return [Finding(
        severity="warning",
        title=f"pipeline bubble {measured:.2f} vs the schedule's (p-1)/m = {ideal:.2f}",
        detail=f"p={p} stages, m={m} microbatches; stages wait on send/recv for {measured:.0%} of compute.",
        evidence={"pp": p, "microbatches": m, "bubble_ideal": ideal, "bubble_measured": measured,
                  "bubble_by_rank": evidence.by_rank(by_rank)},
        ranks=[int(r) for r in by_rank.index[by_rank >= max(MIN_BUBBLE, min(ideal + TOLERANCE, measured))]],
        recoverable_s=max(measured - ideal, 0.0) * compute if measured > ideal else ideal / 2 * compute,
        fixes=_fixes(trace, p, m))]


def _fixes(trace: Trace, p: int, m: int) -> list[Fix]:
    """DeepSpeed's PipelineEngine (also under Megatron-DeepSpeed) has no interleaved schedule and no
    per-stage layer-count flags: its knobs are the micro-batch count (gradient_accumulation_steps, with
    the micro-batch size or train_batch_size that keeps DeepSpeed's batch check) and PipelineModule's
    partition_method."""
    target = max(4 * (p - 1), m)
    if not any(h.get("pipeline_engine") == "deepspeed" for h in trace.headers.values()):
        return [Fix(f"raise microbatches per step to >= {4 * (p - 1)} (bubble (p-1)/m <= 0.25) and "
                    "interleave virtual stages",
                    ds_config={"gradient_accumulation_steps": target},
                    megatron_args=["--num-layers-per-virtual-pipeline-stage", "2"]),
                Fix("balance layers across stages (first/last stages also hold embedding and loss)",
                    megatron_args=["--decoder-first-pipeline-num-layers", "<fewer>",
                                   "--decoder-last-pipeline-num-layers", "<fewer>"])]
    fixes = []
    if target > m:
        fixes.append(_more_microbatches(trace, p, m, target))
    fixes.append(Fix("balance the stages: PipelineModule(partition_method='parameters', or "
                     "'type:<block class>') so the first and last stages, which also hold the embedding "
                     "and the loss, get fewer blocks"))
    return fixes


def _more_microbatches(trace: Trace, p: int, m: int, target: int) -> Fix:
    """m -> target micro-batches; the global batch (micro x m x dp) stays where the micro-batch divides."""
    cfg = config.ds_config(trace)
    micro, batch = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("train_batch_size")
    patch: dict[str, Any] = {"gradient_accumulation_steps": target}
    args: list[str] = []
    what = f"(p-1)/(m+p-1) {(p - 1) / (m + p - 1):.2f} -> {(p - 1) / (target + p - 1):.2f}"
    if micro and int(micro) * m % target == 0:
        patch["train_micro_batch_size_per_gpu"] = int(micro) * m // target
        args = ["--micro-batch-size", str(patch["train_micro_batch_size_per_gpu"])]
        what += ", same global batch"
    elif batch:  # DeepSpeed checks train_batch_size = micro x accumulation x dp
        patch["train_batch_size"] = int(batch) // m * target
        what += f", global batch {batch} -> {patch['train_batch_size']}"
    megatron = any(h.get("megatron") for h in trace.headers.values())
    return Fix(f"raise the pipeline's micro-batches per step from {m} to {target} ({what})", ds_config=patch,
               megatron_args=args if megatron else [])
