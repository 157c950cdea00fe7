"""`rank_steps`: the rules' (rank, step) matching as columns gives what the tuples a row gave."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.metrics import rank_steps


def _frame(rng: np.random.Generator, n: int, step_dtype: str) -> pd.DataFrame:
    return pd.DataFrame({"rank": rng.integers(0, 4, n), "step": rng.integers(0, 30, n).astype(step_dtype)})


def test_the_same_rows_as_tuples_in_a_set_and_a_dict():
    rng = np.random.default_rng(7)
    df = _frame(rng, 500, "float64")  # a kernel's steps are floats (NaN where none), others ints
    df.loc[::17, "step"] = np.nan
    other = _frame(rng, 60, "int64").drop_duplicates()
    seen = set(zip(other["rank"], other["step"]))
    assert rank_steps.among(df, other).tolist() == [(r, s) in seen for r, s in zip(df["rank"], df["step"])]
    values = pd.Series(rng.random(len(other)), index=rank_steps.keys(other))
    values.iloc[::5] = np.nan
    want = pd.Series(list(zip(df["rank"], df["step"]))).map(values).fillna(0.0).to_numpy()
    assert np.array_equal(rank_steps.looked_up(df, values), want)
    assert not rank_steps.looked_up(df, values.iloc[:0]).any()
    steps = other.sort_values(["rank", "step"], ignore_index=True)  # a step frame's rows: in order
    want = pd.Series(list(zip(steps["rank"], steps["step"]))).map(values).fillna(0.0).to_numpy()
    assert np.array_equal(rank_steps.looked_up(steps, values), want)
    some = values.iloc[::2]
    want = pd.Series(list(zip(steps["rank"], steps["step"]))).map(some).fillna(0.0).to_numpy()
    assert np.array_equal(rank_steps.looked_up(steps, some), want)
    by_rank = {0: {1, 2}, 3: set()}
    assert rank_steps.among(df, rank_steps.pairs(by_rank.items())).tolist() == [
        r in by_rank and s in by_rank[r] for r, s in zip(df["rank"], df["step"])
    ]
    assert not rank_steps.among(df, rank_steps.pairs({}.items())).any()
    assert not rank_steps.among(df, rank_steps.pairs({1: set()}.items())).any()
