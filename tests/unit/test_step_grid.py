"""`steps.by_step_and_rank`, a step x rank grid made in one array for a step frame's rows, gives
what `pivot_table` gave: null values, ranks or steps with no value (dropped as pivot_table drops
them), rows in any order or a key twice (pivot_table itself)."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.metrics.steps import by_step_and_rank


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 8), st.one_of(st.floats(0, 10), st.just(float("nan")))),
        max_size=30,
    ),
    st.booleans(),
    st.booleans(),
)
def test_grid_is_pivot_tables(rows, in_order, int_values):
    df = pd.DataFrame(rows, columns=["rank", "step", "x"]).astype({"rank": "int64", "step": "int64"})
    if in_order:  # (a step frame's rows: each key once, by rank and step)
        df = df.drop_duplicates(["rank", "step"]).sort_values(["rank", "step"], ignore_index=True)
    if int_values:
        df = df.dropna().astype({"x": "int64"})
    want = df.pivot_table(index="step", columns="rank", values="x")
    got = by_step_and_rank(df, "x")
    if want.empty:
        assert got.empty
        return
    pd.testing.assert_frame_equal(got, want)
