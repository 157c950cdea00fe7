"""Test helper: a `Reduction` computed a window of steps at a time and merged equals it on the
whole trace (the windowed pass's contract, `diag.metrics.reduction`).

    assert_windowed(load_trace(folder), MyReduction(...), same=my_equal)

Windows of 2 and 5 steps (`windowed.split`: the windows the lock-step reader
gives), each reduced with `window_metrics.of_window` (the whole trace's steps and members) and
merged in step order (a job of over 40 steps: 7 for 1, for time). `same(whole, merged)` asserts
equality (default: `==`, or pandas' exact equality for frames and series).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pandas as pd

from diag.metrics import window_metrics, windowed
from diag.metrics.stage import Metrics
from diag.trace.model import Trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = os.path.join(ROOT, "sample_traces")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
SIZES = (2, 5)  # (one window is `Metrics.reduce`'s own path; windows of 1: the suite's time)
_WITHHELD = ("comm", "layer", "comm_open")  # the frames the windowed pass never holds whole


def diag_folders() -> list[str]:
    """Every diag sample and fixture folder (rank-*.jsonl), by path."""
    out = []
    for base in (SAMPLES, FIXTURES):
        for name in sorted(os.listdir(base)):
            d = os.path.join(base, name)
            ranks = os.path.isdir(d) and [f for f in os.listdir(d) if f.startswith("rank-")]
            if ranks and any(f.endswith(".jsonl") for f in ranks):
                out.append(d)
    return out


def windows(trace: Trace, size: int) -> list[Trace]:
    """`trace`'s windows of `size` steps (its records of no step in each); asserts no per-call or
    per-layer record lies outside every step (the windowed pass reads such a trace whole)."""
    parts, outside = windowed.split(trace, size)
    for kind in _WITHHELD:
        assert outside.frame(kind).empty, f"{kind} records outside every step"
    return parts


def _equal(a: Any, b: Any) -> None:
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    elif isinstance(a, pd.Series):
        pd.testing.assert_series_equal(a, b, check_exact=True)
    else:
        assert a == b


def assert_windowed(
    trace: Trace, r: Any, same: Callable[[Any, Any], None] = _equal, sizes: tuple[int, ...] = SIZES
) -> Any:
    """`r` merged over `trace`'s windows of each size equals `Metrics(trace).reduce(r)`; returns the
    whole value."""
    whole_m = Metrics(trace)
    want = whole_m.reduce(r)
    context = window_metrics.Whole.of(whole_m)
    long = whole_m.steps["step"].nunique() > 40 if len(whole_m.steps) else False
    for size in sorted({max(s, 7) if long else s for s in sizes}):  # (a long job: windows of 7, not 1)
        got = window_metrics.merged(r, windows(trace, size), context)
        try:
            same(want, got)
        except AssertionError as e:
            raise AssertionError(f"windows of {size} step(s): {e}") from e
    return want
