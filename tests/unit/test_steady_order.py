"""`steps.steady` of rows in (rank, step) order (a step frame's) tells each rank's warm-up by its
position; it keeps the rows the sort-and-groupby path (`nth_step`) keeps, whatever the ranks, their
step counts, gaps in the steps, the frame's index or `skip`."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.metrics.steps import in_order, steady


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(st.integers(-2, 6), st.sets(st.integers(0, 12), min_size=1, max_size=9), max_size=5),
    st.integers(0, 3),
    st.integers(0, 5),
)
def test_in_order_steady_keeps_what_the_groupby_path_keeps(steps_of, skip, offset):
    keys = [(r, s) for r in sorted(steps_of) for s in sorted(steps_of[r])]
    df = pd.DataFrame(keys, columns=["rank", "step"], dtype="int64")
    df.index += offset  # (a slice of a larger frame keeps its labels)
    df["x"] = range(len(df))
    assert in_order(df["rank"], df["step"])
    # the other path: steps as floats are not `in_order` (a sort and groupbys find the n-th step)
    want = steady(df.astype({"step": "float64"}), skip)
    got = steady(df, skip)
    pd.testing.assert_frame_equal(got, want.astype({"step": "int64"}))
