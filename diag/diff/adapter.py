"""The one place `diag diff` reads diag's metrics and analyzers.

The metrics are being reshaped into one typed stage; keeping every call here means that change
touches this module only. Each function is a thin pass-through with the shape diff needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd

if TYPE_CHECKING:
    from diag.findings import Finding
    from diag.trace.model import Trace

Spans = tuple[np.ndarray, np.ndarray]  # a union of intervals: sorted disjoint (starts, ends)


def step_times(trace: Trace) -> pd.DataFrame:
    """rank, step, dur_ns of every timed step (step events, else the log's iteration times)."""
    from diag.metrics import breakdown

    return breakdown.step_times(trace)


def activity(trace: Trace, rank: int) -> tuple[pd.DataFrame, str]:
    """One rank's device (or host, on CPU Kineto traces) intervals ts/end/kind and their source."""
    from diag.metrics.activity import activity as _activity

    return _activity(trace, rank)


def compute_kind() -> str:
    from diag.importers.kineto_names import COMPUTE

    return COMPUTE


def union(ts: npt.ArrayLike, end: npt.ArrayLike) -> Spans:
    from diag.metrics import intervals

    return intervals.merge(np.asarray(ts, np.int64), np.asarray(end, np.int64))


def length(spans: Spans) -> int:
    from diag.metrics import intervals

    return intervals.total(*spans)


def overlap(a: Spans, b: Spans) -> int:
    from diag.metrics import intervals

    return intervals.overlap(a, b)


def union_by_group(df: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Length (ns) of the union of each group's [ts, ts + dur) intervals."""
    from diag.metrics import intervals

    return intervals.union_by_group(df, keys)


def busbw(ops: pd.Series, nbytes: pd.Series, dur_ns: pd.Series, group_sizes: pd.Series) -> np.ndarray:
    """Bus bandwidth (GB/s) of every collective row, nccl-tests factors."""
    from diag.metrics import bandwidth

    return bandwidth.busbw(ops, nbytes, dur_ns, group_sizes)


def findings(trace: Trace) -> tuple[list[Finding], dict[str, str]]:
    """Every analyzer rule on one side: (findings, {rule: failure})."""
    from diag.analyzers import run_all

    return run_all(trace)
