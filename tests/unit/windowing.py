"""Test helper: a `Reduction` computed a window of steps at a time and merged equals it on the
whole trace (the windowed pass's contract, `diag.metrics.reduction`).

    assert_windowed(load_trace(folder), MyReduction(...), same=my_equal)

Windows of 2 and 5 steps (`windowed.split`: the windows the lock-step reader
gives), each reduced with `window_metrics.of_window` (the whole trace's steps and members) and
merged in step order (a job of over 40 steps: 7 for 1, for time). `same(whole, merged)` asserts
equality (default: `==`, or pandas' exact equality for frames and series).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from diag.metrics import window_metrics, windowed, windowed_stage
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
    for i, size in enumerate(sorted({max(s, 7) if long else s for s in sizes})):  # (long: windows of 7)
        parts = window_metrics.parts(r, windows(trace, size), context)
        got = r.merged(parts)
        try:
            same(want, got)
            if i == 0 and getattr(r, "folds", False):  # (the most windows)
                assert_folds(r, parts, got)
        except AssertionError as e:
            raise AssertionError(f"windows of {size} step(s): {e}") from e
    return want


def assert_folds(r: Any, parts: list[Any], got: Any) -> None:
    """`r`'s `parts` folded as the windowed pass folds them (`windowed_stage.add`), joined each 1,
    2 and 3 windows, merge to exactly `got` (`exact`: the same rows, order, index, dtypes, bits)."""
    for fold in (1, 2, 3):
        held: list[Any] = []
        for p in parts:
            windowed_stage.add(r, held, p, fold)
        try:
            exact(got, r.merged(held))
        except AssertionError as e:
            raise AssertionError(f"folded each {fold} window(s): {e}") from e


def exact(a: Any, b: Any) -> None:
    """`a` is `b`: frames, series and indexes exactly (dtypes, index, order), floats bit for bit
    (NaN as NaN), dataclasses and containers field by field, in order."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True, check_index_type=True)
    elif isinstance(a, pd.Series):
        pd.testing.assert_series_equal(a, b, check_exact=True, check_index_type=True)
    elif isinstance(a, pd.Index):
        pd.testing.assert_index_equal(a, b, exact=True)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            exact(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            exact(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            exact(a[k], b[k])
    elif isinstance(a, float):
        assert np.float64(a).tobytes() == np.float64(b).tobytes(), (a, b)
    else:
        assert a == b, (a, b)
