"""Idle accelerator between steps: the next batch is not ready (data loader, host-side work)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diag.analyzers import evidence, framework
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix
from diag.metrics import input_wait
from diag.metrics.idle import gaps
from diag.ranks import rank_name

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

GAP_SHARE = 0.15  # median gap / (step + gap)
MIN_GAP_S = 0.005  # and at least 5 ms
MIN_STEPS = 3  # a rank is judged on at least this many measured steps: one sampled step (layers every
# 50 steps) is one descheduling under load (15 ms once in a fault-matrix run at load 9), not an input
# pipeline, which is late on every step


@rule("idle_between_steps")
def idle_between_steps(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when the median idle time before a step's work (the gap between steps plus the lead-in
    to the first forward, less the time the rank spent in collectives there: that is communication,
    not input) is >= 15% of the step's wall time (step + gap) and >= 5 ms on some rank: the
    accelerator idles while the host prepares data; each rank judged on >= 3 measured steps (where
    per-layer records exist, the sampled ones). Fix: DataLoader num_workers / pin_memory /
    prefetch_factor / persistent_workers; Megatron --num-workers above its current value.
    recoverable_s: the median idle time. Severity: the worst rank's idle share of its wall time.
    In a profiler trace the fetch is inside the step: its DataLoader `__next__` ops with no kernel
    running (`input_wait`); the fix then follows the loader torch names (num_workers=0 or not)."""
    g = gaps(metrics)
    if g.empty:
        return []
    g = g.assign(gap_s=(g["gap_s"] - g["comm_gap_s"]).clip(lower=0))  # collectives are not input time
    g = g[g.groupby("rank")["step"].transform("size") >= MIN_STEPS]
    if g.empty:
        return []
    med = g.groupby("rank")[["gap_s", "wall_s", "comm_gap_s"]].median()
    med["share"] = med["gap_s"] / med["wall_s"]
    bad = med[(med["share"] >= GAP_SHARE) & (med["gap_s"] >= MIN_GAP_S)]
    if bad.empty:
        return []
    gap = float(bad["gap_s"].median())
    worst = bad["share"].idxmax()
    cost = Cost(float(bad.loc[worst, "gap_s"]), float(bad.loc[worst, "wall_s"]))
    if "loader_s" in g:  # a profiler trace: the fetch is inside its steps
        single = input_wait.single_process(trace.frame("cpu_op"))
        title = f"{cost.share:.0%} of wall time waits for the DataLoader ({gap * 1e3:.1f} ms per step)"
        detail = (
            "each step's DataLoader `__next__` holds the host while the device has nothing to run"
            + (" (num_workers=0: the batches are loaded in the training process)" if single else "")
            + f"; on {rank_name(worst)} this {cost.text}"
        )
        fixes = _loader_fixes(bool(single))
    else:
        title = f"{cost.share:.0%} of wall time idles between steps ({gap * 1e3:.1f} ms per step)"
        detail = (
            "nothing runs between one optimizer step and the next forward: the input pipeline is "
            f"late; on {rank_name(worst)} this {cost.text}"
        )
        fixes = _fixes(framework.job_of(metrics))
    return [
        Finding(
            severity=cost.severity,
            title=title,
            detail=detail,
            evidence={
                **cost.evidence(),
                "gap_s": evidence.by_rank(med["gap_s"]),
                "gap_share": evidence.by_rank(med["share"]),
                "collectives_in_gap_s": evidence.by_rank(med["comm_gap_s"]),
            },
            ranks=sorted(int(r) for r in bad.index),
            recoverable_s=gap,
            fixes=fixes,
        )
    ]


def _loader_fixes(single: bool) -> list[Fix]:
    """The DataLoader's own arguments: from none to 4 workers, or, where workers already load (their
    count is not in the trace), more of them and deeper prefetching."""
    if single:
        return [
            Fix(
                "load batches in background workers: DataLoader(num_workers=4, pin_memory=True, "
                "prefetch_factor=4, persistent_workers=True)"
            )
        ]
    return [
        Fix("the DataLoader's workers fall behind: raise its num_workers and prefetch_factor above theirs")
    ]


def _fixes(job: framework.Job) -> list[Fix]:
    fixes = [
        Fix(
            "prefetch batches in background workers: DataLoader(num_workers=4, pin_memory=True, "
            "prefetch_factor=4, persistent_workers=True)"
        )
    ]
    if job.megatron:
        now = job.arg("num_workers")
        if isinstance(now, int) and not isinstance(now, bool):
            args = job.flags("--num-workers", str(max(2 * now, 4)))
            if args:
                fixes = [
                    Fix(
                        f"more data-loader workers: --num-workers {now} -> {max(2 * now, 4)}",
                        megatron_args=args,
                    )
                ]
        elif job.flags("--num-workers", "4"):
            fixes = [
                Fix(
                    "if --num-workers is below 4 (Megatron's default is 2), raise it",
                    megatron_args=job.flags("--num-workers", "4"),
                )
            ]
    return fixes
