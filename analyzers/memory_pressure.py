"""Device memory near capacity, or fragmented (the allocator reserves far more than it hands out)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import config, framework
from diag.analyzers.base import rule

from diag.findings import Finding, Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

NEAR_CAPACITY = 0.90  # peak / capacity
CRITICAL_CAPACITY = 0.97  # ... and critical from this share on
FRAG_RATIO = 1.5  # reserved / allocated at the peak ...
FRAG_MIN_BYTES = 1 << 30  # ... wasting at least 1 GiB


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series(dtype=float)


def _fragmentation_fixes() -> list[Fix]:
    """Fragmentation is the allocator's: sharding or offloading state does not change it."""
    return [
        Fix(
            "let the caching allocator grow segments instead of stranding blocks (if not already set)",
            env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        )
    ]


def _capacity_fixes(trace: Trace, job: framework.Job) -> list[Fix]:
    """Less memory per rank, each fix only where it changes the job's setting and its framework has it."""
    fixes = []
    lay = trace.layout()
    names = ("--recompute-activations", "--checkpoint-activations")  # newer / older spelling
    recompute = job.spelling(*names)
    on = any(job.arg(a) for a in names) or job.arg("recompute_granularity")
    if job.megatron and recompute and not on:
        fixes.append(
            Fix(
                "recompute activations in backward instead of keeping them",
                megatron_args=job.flags(recompute),
            )
        )
    micro = job.ds_config.get("train_micro_batch_size_per_gpu") or lay.get("micro_batch")
    accum = job.ds_config.get("gradient_accumulation_steps") or lay.get("grad_accum")
    if job.deepspeed and isinstance(micro, int) and micro >= 2 and isinstance(accum, int):
        fixes.append(
            Fix(
                f"keep the global batch with micro-batch {micro} -> {micro // 2} and "
                f"gradient accumulation {accum} -> {accum * 2}",
                ds_config={
                    "train_micro_batch_size_per_gpu": micro // 2,
                    "gradient_accumulation_steps": accum * 2,
                },
            )
        )
    elif job.framework == framework.MEGATRON_LM and isinstance(micro, int) and micro >= 2:
        fixes.append(
            Fix(
                f"halve the micro-batch ({micro} -> {micro // 2}); the global batch stays",
                megatron_args=job.flags("--micro-batch-size", str(micro // 2)),
            )
        )
    if job.deepspeed:
        stage = config.zero_stage(trace)
        pp = int(lay.get("pp") or 1)
        if stage < 3 and (pp == 1 or stage < 1):  # DeepSpeed's pipeline engine takes ZeRO stage <= 1
            fixes.append(
                Fix(
                    f"shard more state: ZeRO stage {stage} -> {stage + 1}",
                    ds_config={"zero_optimization": {"stage": stage + 1}},
                )
            )
        offload = job.zero.get("offload_optimizer")
        if stage >= 1 and not (isinstance(offload, dict) and offload.get("device") not in (None, "none")):
            fixes.append(
                Fix(
                    "offload optimizer state to CPU memory",
                    ds_config={
                        "zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
                    },
                )
            )
    return fixes


@rule("memory_pressure")
def memory_pressure(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a rank's peak device memory reaches >= 90% of capacity (warning; critical >= 97%), or
    when reserved >= 1.5x the max allocated (the peak, not the allocation after the iteration) with
    >= 1 GiB above it (fragmentation; silent without a recorded peak). Fix: fragmentation ->
    expandable_segments only; near capacity -> activation recomputation (Megatron), halved micro-batch
    with doubled accumulation (computed from the config), next ZeRO stage (not past 1 with a DeepSpeed
    pipeline), CPU optimizer offload where not already on."""
    mem = trace.memory
    if mem.empty:
        return []
    # CPU jobs have no device allocator: the process RSS against host memory is the peak that matters
    peak = _num(mem, "peak").fillna(_num(mem, "allocated")).fillna(_num(mem, "rss"))
    df = mem.assign(
        peak=peak, cap=_num(mem, "capacity"), alloc=_num(mem, "allocated"), res=_num(mem, "reserved")
    ).dropna(subset=["peak"])
    if df.empty:
        return []
    out = []
    worst = df.loc[df.groupby("rank")["peak"].idxmax()]
    near = worst[(worst["cap"] > 0) & (worst["peak"] / worst["cap"] >= NEAR_CAPACITY)]
    # the premise is what the allocator held at its fullest: reserved against the *max* allocated
    # (reserved never shrinks below the peak's blocks), never the allocation after the iteration
    hi = _num(mem, "peak").reindex(df.index)
    frag = df.assign(hi=hi).dropna(subset=["hi", "res"])
    frag = frag[
        (frag["hi"] > 0)
        & (frag["res"] >= FRAG_RATIO * frag["hi"])
        & (frag["res"] - frag["hi"] >= FRAG_MIN_BYTES)
    ]
    if not near.empty:
        share = float((near["peak"] / near["cap"]).max())
        out.append(
            Finding(
                severity="critical" if share >= CRITICAL_CAPACITY else "warning",
                title=f"device memory peaks at {share:.0%} of capacity",
                detail="an allocation spike or a longer sequence will hit out-of-memory",
                evidence={
                    "peak_bytes": {int(r): int(p) for r, p in zip(near["rank"], near["peak"])},
                    "capacity_bytes": float(near["cap"].max()),
                    "peak_share": share,
                },
                ranks=sorted(int(r) for r in near["rank"]),
                steps=sorted({int(s) for s in near["step"].dropna()}),
                layers=sorted({str(m) for m in near.get("module", pd.Series()).dropna()}),
                fixes=_capacity_fixes(trace, framework.job_of(metrics)),
            )
        )
    if not frag.empty:
        waste = float((frag["res"] - frag["hi"]).max())
        out.append(
            Finding(
                severity="warning",
                title=f"allocator fragmentation: {waste / 2**30:.1f} GiB reserved above the peak allocation",
                detail=(
                    "the allocator reserves far more than the job ever held at once (max allocated): freed "
                    "blocks cannot be reused for new sizes"
                ),
                evidence={
                    "stranded_bytes": waste,
                    "reserved_over_max_allocated": float((frag["res"] / frag["hi"]).max()),
                },
                ranks=sorted(int(r) for r in frag["rank"].unique()),
                steps=sorted({int(s) for s in frag["step"].dropna()})[:20],
                fixes=_fragmentation_fixes(),
            )
        )
    return out
