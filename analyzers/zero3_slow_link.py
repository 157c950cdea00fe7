"""ZeRO-3 over slow links: parameter all-gathers / gradient reduce-scatters crawl across nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diag.analyzers import config
from diag.analyzers.base import rule
from diag.analyzers.cross_node import (
    LINK_GBS_CPU,
    LINK_GBS_GPU,
    SLOW_FRACTION,
    STEP_SHARE,
    ZERO3_OPS,
    nominal_link_gbs,
    zero3_cross_node,
)

from diag.findings import Cost, Finding, Fix

__all__ = ["LINK_GBS_CPU", "LINK_GBS_GPU", "SLOW_FRACTION", "STEP_SHARE", "ZERO3_OPS", "zero3_slow_link"]

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace


def _fixes(trace: Trace, gpus_per_node: int) -> list[Fix]:
    """ZeRO++ and a larger prefetch, each key only when it changes the job's effective setting."""
    zc = config.zero_config(trace)
    prefetch = float(config.setting(trace, "stage3_prefetch_bucket_size"))
    plus: dict[str, object] = {}
    if gpus_per_node > 1 and int(zc.get("zero_hpz_partition_size") or 1) != gpus_per_node:
        plus["zero_hpz_partition_size"] = gpus_per_node
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        if not zc.get(key):
            plus[key] = True
    fixes = []
    if plus:
        fixes.append(
            Fix(
                "ZeRO++: "
                + ", ".join(f"{k} {v}" for k, v in plus.items())
                + (
                    " (hpZ: a node-local copy of the parameters)" if "zero_hpz_partition_size" in plus else ""
                ),
                ds_config={"zero_optimization": plus},
            )
        )
    raised = prefetch * 4 if prefetch > 0 else float(config.DS_DEFAULTS["stage3_prefetch_bucket_size"])
    bigger: dict[str, object] = {"stage3_prefetch_bucket_size": int(raised)}
    if not config.setting(trace, "overlap_comm"):
        bigger["overlap_comm"] = True
    fixes.append(
        Fix(
            f"fewer, larger gathers that overlap compute: prefetch bucket {prefetch:.0e} -> {raised:.0e}",
            ds_config={"zero_optimization": bigger},
        )
    )
    fixes.append(
        Fix(
            "if the model fits with sharded optimizer state and gradients only, ZeRO-2 stops "
            "gathering parameters every step",
            ds_config={"zero_optimization": {"stage": 2}},
        )
    )
    if nominal_link_gbs(trace) == LINK_GBS_GPU:
        fixes.append(
            Fix(
                "NCCL: ring algorithms use the inter-node links better for large gathers",
                env={"NCCL_ALGO": "Ring"},
            )
        )
    return fixes


@rule("zero3_slow_link")
def zero3_slow_link(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires for ZeRO stage 3 when all-gather / reduce-scatter on groups spanning hosts (headers' host)
    take >= 25% of the median step and the large ones (>= 256 KiB) move under 25% of the nominal
    inter-node link on GPU jobs (25 GB/s), under 2% on CPU/gloo jobs (1.25 GB/s: gloo's CPUs bound it
    far below the link; 0.12-0.13 GB/s on a plain veth, 0.002 GB/s over 40 Mbit/s): their bus bytes over
    their transfer time (each op's shortest duration over its group: a rank's wait for a late peer is
    not the link's). Smaller ops tell latency and waiting, not the link; without a large one the
    bandwidth is not measured and the rule is silent. Fix: ZeRO++ hpZ + quantized weights/gradients,
    larger stage3_prefetch_bucket_size, ZeRO-2, NCCL_ALGO=Ring. recoverable_s: the time the same bytes
    would save at the nominal link bandwidth; `what_if_lost_s` that summed over the steps (each step's
    cross-node time beyond it). Severity: the cross-node share of the step (its >= 25% premise makes it
    critical)."""
    cn = zero3_cross_node(trace, metrics)
    if cn is None or not cn.slow:
        return []
    calls, per, step_s, cross_s, busbw, link = cn.calls, cn.per, cn.step_s, cn.cross_s, cn.busbw, cn.link
    host_of = trace.hosts()
    aggregate = calls.moved / calls.dur_s  # bus bytes (GB) moved over the calls' seconds
    nsteps = max(per["step"].nunique(), 1)
    nranks = max(len(calls.ranks), 1)
    # the bytes of the compared (steady) steps, not the warm-up step's too
    steady = calls.bytes[calls.bytes.index.isin(per["step"])]
    ideal_s = float(steady.astype(float).sum()) / (link * 1e9) / nsteps / nranks
    per_node = max(sum(1 for h in host_of.values() if h == v) for v in set(host_of.values()))
    cost = Cost(cross_s, step_s)
    # the what-if: each step had the same bytes moved at the nominal link, summed over the steps (at
    # most: compute may overlap part of the gathers)
    lost = (per.groupby("step")["comm_s"].median() - ideal_s).clip(lower=0)  # the ranks' median per step
    return [
        Finding(
            severity=cost.severity,
            title=f"ZeRO-3 gathers across nodes run at {busbw:.3g} GB/s, {cross_s / step_s:.0%} of each step",
            detail=(
                f"all_gather/reduce_scatter on groups spanning {len(set(host_of.values()))} hosts move "
                f"their large transfers at {busbw:.3g} GB/s of bus bandwidth against a nominal {link:g} "
                "GB/s link: this "
                f"{cost.text}. Had the link run at {link:g} GB/s, the same bytes would take "
                f"{ideal_s * 1e3:.1f} ms a step: the {len(lost)} steps would be up to "
                f"{float(lost.sum()) * 1e3:.1f} ms shorter in all."
            ),
            evidence={
                **cost.evidence(),
                "busbw_gbs": busbw,
                "busbw_aggregate_gbs": aggregate,
                "nominal_link_gbs": link,
                "cross_node_comm_s": cross_s,
                "step_s": step_s,
                "step_share": cross_s / step_s,
                "ops": calls.ops,
                "bytes_per_step_per_rank": float(calls.bytes.sum()) / nsteps / nranks,
                "hosts": sorted(set(host_of.values())),
                "ideal_step_comm_s": ideal_s,
                "what_if_lost_s": float(lost.sum()),
                "what_if_steps": len(lost),
            },
            ranks=sorted(calls.ranks),
            layers=list(calls.modules),
            steps=sorted(int(s) for s in per["step"].unique())[:20],
            recoverable_s=max(cross_s - ideal_s, 0.0),
            fixes=_fixes(trace, per_node),
        )
    ]
