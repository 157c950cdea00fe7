"""`steps.step_frame` shares the step records' columns instead of copying them, and gives the frame
the copying version gave for every input: rows out of order, equal (rank, step) keys, steps without
a duration, steps that are not integers."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.metrics import breakdown
from diag.metrics.steps import NS, step_frame
from diag.trace.model import Trace


def _copied(steps: pd.DataFrame) -> pd.DataFrame:
    """The frame as `step_frame` made it before it shared columns (a deep copy, then a sort)."""
    df = steps.copy()
    df["dur"] = pd.to_numeric(df["dur"], errors="coerce")
    df = df.dropna(subset=["dur"])
    df = df[df["dur"] > 0].copy()
    df["dur_s"] = df["dur"] / NS
    df["start"] = pd.to_numeric(df["ts"])
    df["end"] = df["start"] + df["dur"]
    return df.sort_values(["rank", "step"]).reset_index(drop=True)


def _steps(ranks: int, per: int) -> pd.DataFrame:
    """A writer's step records: by rank, then time, each step once, every one timed."""
    n = ranks * per
    return pd.DataFrame(
        {
            "step": np.tile(np.arange(per), ranks),
            "ts": np.arange(n, dtype=np.int64) * 1000,
            "dur": np.full(n, 900, dtype=np.int64),
            "samples": [None] * n,
            "applied": np.ones(n, dtype=bool),
            "rank": np.repeat(np.arange(ranks), per),
        }
    )


def test_a_writers_steps_keep_their_columns_shared_and_untouched():
    raw = _steps(4, 50)
    before = raw.copy()
    out = step_frame(raw)
    pd.testing.assert_frame_equal(out, _copied(raw))
    for col in ("step", "ts", "dur", "samples", "rank"):
        assert np.shares_memory(out[col].to_numpy(), raw[col].to_numpy()), col
    assert np.shares_memory(out["start"].to_numpy(), raw["ts"].to_numpy())  # (numeric: not converted)
    out.loc[0, "ts"] = -1  # (a reader that writes into its frame: the records stay as read)
    pd.testing.assert_frame_equal(raw, before)


_row = st.tuples(
    st.integers(0, 2),  # rank
    st.integers(0, 4),  # step
    st.one_of(st.none(), st.integers(-5, 50)),  # dur
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_row, max_size=30), st.booleans(), st.sampled_from([None, "float64", "object"]), st.booleans()
)
def test_any_steps_give_the_frame_the_copying_version_gave(rows, float_steps, dur_dtype, object_ts):
    df = pd.DataFrame(rows, columns=["rank", "step", "dur"])
    if dur_dtype:
        df["dur"] = df["dur"].astype(dur_dtype)
    df["ts"] = np.arange(len(df), dtype=np.int64) * 10
    if object_ts:  # (a log's records: numbers as objects, converted)
        df["ts"] = df["ts"].astype(object)
    if float_steps:  # (steps attributed by time are floats: never taken as in order)
        df["step"] = df["step"].astype(float)
    if df.empty:
        assert step_frame(df).empty
        return
    pd.testing.assert_frame_equal(step_frame(df), _copied(df))


@settings(max_examples=300, deadline=None)
@given(st.lists(_row, max_size=30), st.booleans(), st.sampled_from([None, "float64", "object"]))
def test_step_times_share_the_step_frames_columns_only_where_its_rows_are_theirs(rows, in_order, dur_dtype):
    """`breakdown.step_times` given the step frame gives the rows and values it gives alone: keys
    in order or not, a step twice, durations null, zero or negative, integers, floats or objects."""
    df = pd.DataFrame(rows, columns=["rank", "step", "dur"])
    if in_order:
        df = df.drop_duplicates(["rank", "step"]).sort_values(["rank", "step"], ignore_index=True)
    df["ts"] = np.arange(len(df), dtype=np.int64) * 10
    if dur_dtype:
        df["dur"] = df["dur"].astype(dur_dtype)
    trace = Trace(frames={"step": df})
    alone = breakdown.step_times(trace)
    shared = breakdown.step_times(trace, step_frame(df))
    pd.testing.assert_frame_equal(shared.reset_index(drop=True), alone.reset_index(drop=True))


def test_step_times_of_a_writers_steps_with_an_untimed_first_step_are_the_step_frames_columns():
    raw = _steps(3, 20).astype({"dur": float})
    raw.loc[raw["step"] == 0, "dur"] = np.nan
    frame = step_frame(raw)
    out = breakdown.step_times(Trace(frames={"step": raw}), frame)
    assert np.shares_memory(out["dur_ns"].to_numpy(), frame["dur"].to_numpy())
    pd.testing.assert_frame_equal(
        out, breakdown.step_times(Trace(frames={"step": raw})).reset_index(drop=True)
    )
