"""Launch-bound GPU: kernels shorter than the CPU calls that launch them, so the GPU idles waiting for
the host to issue the next one (Kineto GPU traces, which carry each kernel's launch call)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from diag.analyzers import evidence
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix
from diag.metrics.input_wait import is_loader
from diag.metrics.intervals import merge
from diag.ranks import rank_name

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

SHORT_SHARE = 0.50  # share of kernels shorter than their own launch call
HOST_WAIT_SHARE = 0.30  # and the GPU idles waiting for a launch this share of its active span
MIN_KERNELS = 100  # launched kernels on the rank; fewer say nothing about a steady loop


def host_wait(k: pd.DataFrame, fetches: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """One rank's kernels -> short-kernel share, GPU idle waiting on the host (ns), active span (ns).

    An idle gap waits on the host when the kernel that ends it was still being launched (its launch
    call had not returned) when the GPU went idle: the GPU had nothing queued. Gaps between two
    ProfilerSteps are left out, and gaps a DataLoader fetch overlaps (`fetches`: the rank's merged
    `__next__` intervals, ns): the input pipeline is `idle_between_steps`' business."""
    k = k[(k["launch_ts"] >= 0) & (k["launch_dur"] >= 0)].sort_values("ts", kind="stable")
    ts = k["ts"].to_numpy(np.int64)
    end = ts + k["dur"].to_numpy(np.int64)
    if len(ts) < 2:
        return {"kernels": len(ts), "short_share": 0.0, "host_wait_ns": 0.0, "span_ns": 0.0}
    busy_until = np.maximum.accumulate(end)
    gap = ts[1:] - busy_until[:-1]
    launched_by = (k["launch_ts"] + k["launch_dur"]).to_numpy(np.int64)[1:]
    step = k["step"].to_numpy()
    waits = (gap > 0) & (launched_by > busy_until[:-1]) & (step[1:] == step[:-1])
    if fetches is not None and len(fetches[0]):
        starts, ends = fetches
        first = np.minimum(np.searchsorted(ends, busy_until[:-1], "right"), len(starts) - 1)
        waits &= ~((ends[first] > busy_until[:-1]) & (starts[first] < ts[1:]))  # a fetch inside the gap
    return {
        "kernels": len(ts),
        "short_share": float((k["dur"] < k["launch_dur"]).mean()),
        "median_kernel_us": float(k["dur"].median()) / 1e3,
        "median_launch_us": float(k["launch_dur"].median()) / 1e3,
        "host_wait_ns": float(gap[waits].sum()),
        "span_ns": float(busy_until[-1] - ts[0]),
    }


def _fetches(loads: pd.DataFrame, rank: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A rank's DataLoader fetches as merged intervals (ns), None where it has none."""
    mine = loads[loads["rank"] == rank] if len(loads) else loads
    if mine.empty:
        return None
    ts = mine["ts"].to_numpy(np.int64)
    return merge(ts, ts + mine["dur"].to_numpy(np.int64))


@rule("launch_bound")
def launch_bound(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires on a rank (GPU trace, >= 100 launched kernels) where >= 50% of kernels are shorter than
    their CPU launch call and the GPU idles waiting for the host (a gap ended by a kernel whose launch
    had not returned when the GPU went idle; gaps between steps and gaps a DataLoader fetch overlaps
    excluded) >= 30% of its active span.
    Fix: CUDA graphs (whole step replayed by one launch), torch.compile to fuse small ops, more work
    per kernel (a larger micro-batch). recoverable_s: the host-wait per step. Severity: the host-wait
    share of the GPU's active span."""
    kernels = trace.frame("kernel")
    if kernels.empty or "launch_dur" not in kernels.columns:
        return []
    ops = trace.frame("cpu_op")
    loads = ops[is_loader(ops["name"])] if "name" in ops and len(ops) else ops.iloc[:0]
    found = {int(r): host_wait(k, _fetches(loads, r)) for r, k in kernels.groupby("rank")}
    bound = {
        r: v
        for r, v in found.items()
        if v["kernels"] >= MIN_KERNELS
        and v["span_ns"] > 0
        and v["short_share"] >= SHORT_SHARE
        and v["host_wait_ns"] / v["span_ns"] >= HOST_WAIT_SHARE
    }
    if not bound:
        return []
    share = {r: v["host_wait_ns"] / v["span_ns"] for r, v in bound.items()}
    worst = max(share, key=lambda r: share[r])
    w = bound[worst]
    nsteps = metrics.steps[metrics.steps["rank"] == worst]["step"].nunique() if not metrics.steps.empty else 0
    n = max(int(nsteps), 1)
    per = "step" if nsteps else "of active GPU time"
    cost = Cost(w["host_wait_ns"] / 1e9 / n, w["span_ns"] / 1e9 / n, per)
    return [
        Finding(
            severity=cost.severity,
            title=f"launch-bound GPU: {share[worst]:.0%} of the GPU's time waits for kernel launches "
            f"({rank_name(worst)})",
            detail=(
                f"{w['short_share']:.0%} of kernels run shorter than their launch call (median kernel "
                f"{w['median_kernel_us']:.1f} us, median launch {w['median_launch_us']:.1f} us): the "
                "host cannot issue work as fast as the GPU finishes it."
            ),
            evidence={
                "host_wait_share": evidence.by_rank(pd.Series(share)),
                "short_kernel_share": w["short_share"],
                "kernels": w["kernels"],
                "median_kernel_us": w["median_kernel_us"],
                "median_launch_us": w["median_launch_us"],
            },
            ranks=sorted(bound),
            recoverable_s=w["host_wait_ns"] / 1e9 / nsteps if nsteps else None,
            fixes=[
                Fix(
                    "capture the step in CUDA graphs (torch.cuda.graphs / torch.compile(mode="
                    "'reduce-overhead')): one launch replays all kernels"
                ),
                Fix(
                    "fuse small ops with torch.compile, or give each kernel more work (a larger "
                    "micro-batch with fewer gradient-accumulation steps)"
                ),
            ],
        )
    ]
