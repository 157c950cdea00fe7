"""Interval arithmetic on numpy arrays: union of [ts, end) intervals and their overlap."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.metrics.agg import named


def merge(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint (starts, ends) — HTA's merge_kernel_intervals."""
    if len(ts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(ts, kind="stable")
    ts, end = np.asarray(ts)[order], np.asarray(end)[order]
    reach = np.maximum.accumulate(end)
    new = np.empty(len(ts), bool)
    new[0] = True
    new[1:] = ts[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    starts = ts[new]
    ends = np.maximum.reduceat(end, np.flatnonzero(new))
    return starts, ends[: group[-1] + 1]


def total(starts: np.ndarray, ends: np.ndarray) -> int:
    return int(ends.sum() - starts.sum())


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Time covered by both unions `a` and `b` (each already merged), by a sweep over the edges."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate(
        [np.ones(len(a[0])), -np.ones(len(a[1])), 2 * np.ones(len(b[0])), -2 * np.ones(len(b[1]))]
    )
    order = np.lexsort((delta, times))  # ends before starts at equal times
    times, running = times[order], np.cumsum(delta[order])
    both = running[:-1] == 3
    return int((np.diff(times)[both]).sum())


def union_by_group(df: pd.DataFrame, keys: list[str], ts: str = "ts", dur: str = "dur") -> pd.Series:
    """Length of the union of each group's [ts, ts+dur) intervals (e.g. per rank and step), without
    a Python loop per group: sort, running max of the ends within each group, new block on a gap."""
    # relative to the earliest start: epoch nanoseconds (~1.8e18) lose ~256 ns as float64, and a
    # nullable duration turns the sum into float64
    start = df[ts] - df[ts].min() if len(df) else df[ts]
    d = df[keys].assign(**{ts: start, "_end": start + df[dur]}).sort_values([*keys, ts], kind="stable")
    g = d.groupby(keys, sort=False, observed=True)
    reach = g["_end"].cummax()
    prev = reach.groupby([d[k] for k in keys], sort=False, observed=True).shift()
    block = (prev.isna() | (d[ts] > prev)).cumsum()
    by_block = d.assign(_block=block).groupby("_block", sort=False)
    merged = named(by_block, **{k: (k, "first") for k in keys}, _ts=(ts, "min"), _end=("_end", "max"))
    return (merged["_end"] - merged["_ts"]).groupby([merged[k] for k in keys], observed=True).sum()
