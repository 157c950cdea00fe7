"""Device memory near capacity, or fragmented (the allocator reserves far more than it hands out)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import config
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


def _fixes(zero_stage: int, fragmented: bool) -> list[Fix]:
    fixes = []
    if fragmented:
        fixes.append(Fix("let the caching allocator grow segments instead of stranding blocks",
                         env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
    fixes += [
        Fix("recompute activations in backward instead of keeping them",
            ds_config={"activation_checkpointing": {"partition_activations": True,
                                                    "contiguous_memory_optimization": True}},
            megatron_args=["--recompute-activations"]),
        Fix("keep the global batch with a smaller micro-batch and more gradient accumulation",
            ds_config={"train_micro_batch_size_per_gpu": "halve", "gradient_accumulation_steps": "double"}),
    ]
    if zero_stage < 3:
        fixes.append(Fix(f"shard more state: ZeRO stage {zero_stage + 1}",
                         ds_config={"zero_optimization": {"stage": zero_stage + 1}}))
    fixes.append(Fix("offload optimizer state to CPU memory",
                     ds_config={"zero_optimization": {"offload_optimizer": {"device": "cpu",
                                                                            "pin_memory": True}}}))
    return fixes


@rule("memory_pressure")
def memory_pressure(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a rank's peak device memory reaches >= 90% of capacity (warning; critical >= 97%), or
    when reserved >= 1.5x allocated with >= 1 GiB stranded (fragmentation). Fix: expandable_segments,
    activation checkpointing, smaller micro-batch + more accumulation, higher ZeRO stage, CPU offload."""
    mem = trace.memory
    if mem.empty:
        return []
    # CPU jobs have no device allocator: the process RSS against host memory is the peak that matters
    peak = _num(mem, "peak").fillna(_num(mem, "allocated")).fillna(_num(mem, "rss"))
    df = mem.assign(peak=peak, cap=_num(mem, "capacity"), alloc=_num(mem, "allocated"),
                    res=_num(mem, "reserved")).dropna(subset=["peak"])
    if df.empty:
        return []
    out = []
    worst = df.loc[df.groupby("rank")["peak"].idxmax()]
    near = worst[(worst["cap"] > 0) & (worst["peak"] / worst["cap"] >= NEAR_CAPACITY)]
    frag = df[(df["res"] >= FRAG_RATIO * df["alloc"]) & (df["res"] - df["alloc"] >= FRAG_MIN_BYTES)]
    if not near.empty:
        share = float((near["peak"] / near["cap"]).max())
        out.append(Finding(
            severity="critical" if share >= CRITICAL_CAPACITY else "warning",
            title=f"device memory peaks at {share:.0%} of capacity",
            detail="an allocation spike or a longer sequence will hit out-of-memory",
            evidence={"peak_bytes": {int(r): int(p) for r, p in zip(near["rank"], near["peak"])},
                      "capacity_bytes": float(near["cap"].max()), "peak_share": share},
            ranks=sorted(int(r) for r in near["rank"]), steps=sorted({int(s) for s in near["step"]}),
            layers=sorted({str(m) for m in near.get("module", pd.Series()).dropna()}),
            fixes=_fixes(config.zero_stage(trace), False)))
    if not frag.empty:
        waste = float((frag["res"] - frag["alloc"]).max())
        out.append(Finding(
            severity="warning",
            title=f"allocator fragmentation: {waste / 2**30:.1f} GiB reserved but not allocated",
            detail="reserved memory far above allocated: freed blocks cannot be reused for new sizes",
            evidence={"stranded_bytes": waste,
                      "reserved_over_allocated": float((frag["res"] / frag["alloc"]).max())},
            ranks=sorted(int(r) for r in frag["rank"].unique()),
            steps=sorted({int(s) for s in frag["step"]})[:20], fixes=_fixes(config.zero_stage(trace), True)))
    return out
