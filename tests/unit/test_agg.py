"""The small-trace shortcuts in diag.metrics give pandas' own answers: `agg.named` is `g.agg(...)`
with named aggregations, and `steps.steady` on one rank's steps is its groupby path's result."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from diag.metrics import steps
from diag.metrics.agg import named

SPECS = [
    {"calls": ("dur", "size"), "time": ("dur", "sum"), "sized": ("x", "count"), "most": ("dur", "max")},
    {"busbw": ("x", "median"), "calls": ("x", "size")},
    {"dur": ("dur", "max"), "sampled": ("flag", "any"), "last": ("x", "last")},
    {"rank": ("rank", "first"), "_ts": ("dur", "min"), "n": ("nbytes", "sum")},
]


def _calls(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "rank": rng.integers(0, 3, n),
            "step": rng.integers(0, 4, n),
            "op": pd.Categorical(
                rng.choice(["all_reduce", "broadcast"], n), categories=["a", "all_reduce", "broadcast"]
            ),
            "dur": rng.integers(1, 100, n).astype("int64"),
            "x": np.where(rng.random(n) < 0.3, np.nan, rng.random(n)),
            "flag": rng.random(n) < 0.5,
            "nbytes": pd.array(np.where(rng.random(n) < 0.3, None, rng.integers(1, 9, n)), dtype="Int64"),
        }
    )


@pytest.mark.parametrize("n", [0, 1, 7, 60])
@pytest.mark.parametrize("keys", [["rank", "step"], ["rank", "op"], "step"])
def test_named_is_pandas_named_aggregation(n: int, keys: list[str] | str) -> None:
    g = _calls(n, n).groupby(keys, observed=True)
    for spec in SPECS:
        assert_frame_equal(named(g, **spec), g.agg(**spec), check_exact=True)


def _steady_by_groupby(df: pd.DataFrame, skip: int) -> pd.DataFrame:
    """`steps.steady`'s path for several ranks, forced: the reference for its one-rank shortcut."""
    two = pd.concat([df, df.assign(rank=df["rank"] + 1)])
    out = steps.steady(two, skip)
    return out[out["rank"] == df["rank"].iloc[0]] if len(df) else df


@pytest.mark.parametrize("skip", [0, 1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_steady_on_one_rank_is_the_groupby_answer(skip: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 8))
    step = rng.permutation(n).astype(float)
    if seed % 3 == 0 and n:
        step[rng.integers(0, n)] = np.nan  # a step record without a number drops out either way
    df = pd.DataFrame({"rank": [5] * n, "step": step, "dur_s": rng.random(n)}, index=rng.permutation(n) + 10)
    assert_frame_equal(steps.steady(df, skip), _steady_by_groupby(df, skip))
