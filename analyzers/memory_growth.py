"""Memory that grows every step: a leak (tensors kept per step, a cache never cleared) that ends in
out-of-memory long after its cause, seen from the per-step memory counters before it gets there."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
from diag.analyzers.base import rule

from diag.findings import Finding, Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

WARMUP_STEPS = 2  # first steps allocate optimizer state, buffers, the allocator's pools: not a leak
MIN_STEPS = 8  # steps after the warm-up the growth must hold over
RISING = 0.9  # share of step-to-step increments that rise (a leak grows every step) ...
MIN_PER_STEP_BYTES = 1 << 20  # ... by at least 1 MiB a step (median increment) ...
MIN_SHARE = 0.05  # ... adding >= 5% of the window's first value over the window
_mib = float(1 << 20)
COUNTERS = {"allocated": "device memory (allocated)", "rss": "process memory (RSS)"}


def growth(values: pd.Series) -> dict[str, Any] | None:
    """The steady growth of one rank's per-step counter (indexed by step, sorted), or None: after the
    warm-up, >= 8 steps in which >= 90% of increments rise, the median by >= 1 MiB, adding >= 5%."""
    v = values[values.index >= values.index.min() + WARMUP_STEPS].dropna()
    if len(v) < MIN_STEPS + 1:
        return None
    inc = v.diff().dropna()
    first, last = float(v.iloc[0]), float(v.iloc[-1])
    per_step = float(inc.median())
    if (
        (inc > 0).mean() < RISING
        or per_step < MIN_PER_STEP_BYTES
        or last - first < MIN_SHARE * max(first, 1.0)
    ):
        return None
    return {
        "first_step": int(v.index[0]),
        "last_step": int(v.index[-1]),
        "first_bytes": first,
        "last_bytes": last,
        "per_step_bytes": per_step,
    }


def _finding(counter: str, grown: dict[int, dict[str, Any]], capacity: pd.Series) -> Finding:
    worst = max(grown, key=lambda r: grown[r]["per_step_bytes"])
    g = grown[worst]
    cap = capacity.get(worst)
    left = None
    if cap is not None and cap == cap and cap > g["last_bytes"]:
        left = int((float(cap) - g["last_bytes"]) // g["per_step_bytes"])
    ranks = sorted(grown)
    added = (g["last_bytes"] - g["first_bytes"]) / _mib
    return Finding(
        severity="warning",
        title=(
            f"{COUNTERS[counter]} grows {g['per_step_bytes'] / _mib:.1f} MiB a step on rank"
            f"{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
            f"(+{added:.0f} MiB over steps {g['first_step']}-{g['last_step']})"
        ),
        detail=(
            "memory rises on nearly every step after the warm-up: something is kept per step (tensors "
            "appended to a list, a loss kept with its graph, a cache never cleared)"
            + (f"; at this rate capacity is reached in about {left} steps" if left is not None else "")
        ),
        evidence={
            "counter": counter,
            "growth": {int(r): v for r, v in grown.items()},
            "steps_to_capacity": left,
        },
        ranks=ranks,
        steps=[g["first_step"], g["last_step"]],
        fixes=[
            Fix(
                "find what each step keeps: compare two heap snapshots a few steps apart "
                "(torch.cuda.memory._record_memory_history / tracemalloc) and keep detached values "
                "(loss.item(), tensor.detach()) instead of tensors with their graph"
            )
        ],
    )


@rule("memory_growth")
def memory_growth(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a rank's per-step memory (device `allocated`, else process RSS), after 2 warm-up steps,
    rises on >= 90% of >= 8 consecutive steps, by a median >= 1 MiB a step and >= 5% in all (warning;
    the steps left to capacity at that rate when capacity is known). Silent on a flat or noisy counter.
    Fix: find what each step keeps (heap snapshots), keep detached values."""
    mem = trace.memory
    if mem.empty or "step" not in mem:
        return []
    out = []
    for counter in COUNTERS:
        if counter not in mem:
            continue
        df = mem.assign(
            v=pd.to_numeric(mem[counter], errors="coerce"), s=pd.to_numeric(mem["step"], errors="coerce")
        )
        df = df.dropna(subset=["v", "s"])
        if df.empty:
            continue
        cap = (
            pd.to_numeric(df["capacity"], errors="coerce").groupby(df["rank"]).max()
            if "capacity" in df
            else pd.Series(dtype=float)
        )
        grown = {}
        for rank, d in df.groupby("rank"):
            g = growth(d.groupby(d["s"].astype(int))["v"].last().sort_index())
            if g is not None:
                grown[int(rank)] = g
        if grown:
            out.append(_finding(counter, grown, cap))
    return out
