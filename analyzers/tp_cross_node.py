"""Tensor-parallel group spanning nodes: TP's per-layer all-reduces leave NVLink for the network."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import evidence, framework
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix
from diag.metrics.steps import join_steps

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace


def tp_groups(trace: Trace, metrics: Metrics, tp: int) -> list[tuple[int, ...]]:
    """TP groups as recorded by the comms collector (groups of size tp), else Megatron's default order
    (consecutive global ranks)."""
    seen = {ranks for ranks, size in metrics.groups if size == tp}
    if seen:
        return sorted(seen)
    world = trace.layout().get("world_size") or len(trace.ranks)
    return [tuple(range(i, i + tp)) for i in range(0, int(world), tp)]


@dataclass(frozen=True)
class _In:
    """The calls of these groups (by their recorded members): a pick equal by value, so the
    windowed pass finds the reduction it computed for it (`diag.metrics.reduction`)."""

    groups: frozenset[tuple[int, ...]]

    def __call__(self, c: pd.DataFrame) -> pd.Series:
        wanted = self.groups
        return c["group_ranks"].map(lambda g: isinstance(g, list) and tuple(int(r) for r in g) in wanted)


@rule("tp_cross_node")
def tp_cross_node(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when tp > 1 and any tensor-parallel group holds ranks on more than one host (headers'
    host). Threshold: one such group. Fix: tensor-model-parallel-size <= GPUs per node, ranks of a TP
    group on one node (Megatron's default rank order does this when TP divides GPUs per node).
    recoverable_s: TP-group communication time on those groups per step (upper bound). Severity: that
    time's share of the step where measured, else critical (the placement alone is the premise)."""
    tp = int(trace.layout().get("tp") or 1)
    host_of = trace.hosts()
    if tp <= 1 or len(set(host_of.values())) < 2:
        return []
    bad = [g for g in tp_groups(trace, metrics, tp) if evidence.spans_hosts(list(g), host_of)]
    if not bad:
        return []
    per_node = min(sum(1 for h in host_of.values() if h == v) for v in set(host_of.values()))
    picked = metrics.select(_In(frozenset(bad))) if metrics.calls else None
    per = join_steps(metrics.steady_steps, picked.sums, "comm_s") if picked is not None else None
    tp_s = float(per["comm_s"].median()) if per is not None and not per.empty else None
    step_s = float(per["dur_s"].median()) if per is not None and not per.empty else 0.0
    cost = Cost(tp_s, step_s) if tp_s is not None and step_s > 0 else None
    return [
        Finding(
            severity=cost.severity if cost else "critical",
            title=f"{len(bad)} tensor-parallel group(s) of size {tp} span nodes",
            detail=(
                f"TP={tp} but hosts have {per_node} rank(s) each: every layer's TP all-reduce crosses "
                "the network" + (f"; their collectives {cost.text}." if cost else ".")
            ),
            evidence={
                **(cost.evidence() if cost else {}),
                "tp": tp,
                "ranks_per_host": per_node,
                "groups": [list(g) for g in bad],
                "hosts": {int(r): h for r, h in host_of.items()},
                "tp_comm_s": tp_s,
            },
            ranks=sorted({r for g in bad for r in g}),
            recoverable_s=tp_s,
            fixes=_fixes(trace, framework.job_of(metrics), tp, per_node),
        )
    ]


def _fixes(trace: Trace, job: framework.Job, tp: int, per_node: int) -> list[Fix]:
    """TP down to the ranks per node, the factor moved to pipeline stages (same model split)."""
    if per_node < 1 or per_node >= tp or tp % per_node:
        return [
            Fix(
                "place each tensor-parallel group on one node (Megatron's default rank order does so "
                "when TP divides the GPUs per node)"
            )
        ]
    pp = int(trace.layout().get("pp") or 1)
    args = job.flags(
        "--tensor-model-parallel-size",
        str(per_node),
        "--pipeline-model-parallel-size",
        str(pp * (tp // per_node)),
    )
    return [
        Fix(
            f"keep TP inside a node: tensor parallel {tp} -> {per_node}, pipeline {pp} -> "
            f"{pp * tp // per_node}",
            megatron_args=args,
        )
    ]
