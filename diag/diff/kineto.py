"""Kineto op/kernel deltas, HTA TraceDiff's figures: per name, count and total duration on each side,
the difference, and whether the name was added, removed or kept.

HTA compares one rank and one iteration by default; `op_summary` takes the same choice (`ranks`,
`steps`), and by default sums every rank and profiled step, with per-step figures beside the totals
so runs with a different number of profiled steps compare fairly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from diag.trace.model import Trace

CPU, GPU = "cpu", "gpu"


def _frame(trace: Trace, device: str) -> pd.DataFrame:
    df = trace.frame("kernel" if device == GPU else "cpu_op")
    if "name" not in df.columns or df.empty:
        return pd.DataFrame(columns=["rank", "step", "name", "dur"])
    return df[["rank", "step", "name", "dur"]]


def has_ops(trace: Trace) -> bool:
    return any(not _frame(trace, d).empty for d in (CPU, GPU))


def op_summary(
    trace: Trace,
    ranks: list[int] | None = None,
    steps: list[int] | None = None,
    devices: tuple[str, ...] = (CPU, GPU),
) -> pd.DataFrame:
    """name, device, count, dur_ns over the chosen ranks and steps (all by default)."""
    parts = []
    for device in devices:
        df = _frame(trace, device)
        if ranks is not None:
            df = df[df["rank"].isin(ranks)]
        if steps is not None:
            df = df[df["step"].isin(steps)]
        g = df.assign(name=df["name"].astype(str)).groupby("name", observed=True)["dur"]
        parts.append(pd.DataFrame({"count": g.size(), "dur_ns": g.sum()}).reset_index().assign(device=device))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return out.reindex(columns=["name", "device", "count", "dur_ns"])


def profiled_steps(trace: Trace) -> int:
    st = trace.steps
    return max(int(st["step"].nunique()), 1) if len(st) else 1


def ops_diff(
    a: Trace,
    b: Trace,
    ranks: tuple[list[int] | None, list[int] | None] = (None, None),
    steps: tuple[list[int] | None, list[int] | None] = (None, None),
) -> pd.DataFrame:
    """One row per (device, name): counts and durations of both sides, their differences, `change`
    (added / removed / more / fewer / same count), and per-step durations; sorted by |duration delta|."""
    sa, sb = op_summary(a, ranks[0], steps[0]), op_summary(b, ranks[1], steps[1])
    m = sa.merge(sb, on=["device", "name"], how="outer", suffixes=("_a", "_b"))
    for col in ("count_a", "count_b", "dur_ns_a", "dur_ns_b"):
        m[col] = m[col].fillna(0).astype("int64")
    m["diff_count"] = m["count_b"] - m["count_a"]
    m["diff_dur_ns"] = m["dur_ns_b"] - m["dur_ns_a"]
    m["change"] = [
        "added" if ca == 0 else "removed" if cb == 0 else "more" if d > 0 else "fewer" if d < 0 else "same"
        for ca, cb, d in zip(m["count_a"], m["count_b"], m["diff_count"])
    ]
    na = len(ranks[0] or a.ranks or [0]) * (len(steps[0]) if steps[0] else profiled_steps(a))
    nb = len(ranks[1] or b.ranks or [0]) * (len(steps[1]) if steps[1] else profiled_steps(b))
    m["per_step_dur_ns_a"] = m["dur_ns_a"] / max(na, 1)
    m["per_step_dur_ns_b"] = m["dur_ns_b"] / max(nb, 1)
    order = m["diff_dur_ns"].abs().sort_values(ascending=False, kind="stable").index
    return m.loc[order].reset_index(drop=True)
