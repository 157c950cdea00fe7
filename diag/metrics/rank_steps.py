"""(rank, step) keys of a frame's rows matched as columns: the rules matched them a Python tuple a
row (`zip(df["rank"], df["step"])` into a set or a dict's lookup), 4-6 s and ~160 MB of tuples a
million rank-steps, where pandas' index engine takes 0.1 s (issue 14: 1,024 ranks x 10,000 steps)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from diag.metrics.row_keys import RowKeys


def keys(df: pd.DataFrame) -> pd.MultiIndex:
    """The (rank, step) of each row of `df`."""
    return pd.MultiIndex.from_arrays([df["rank"], df["step"]])


def among(df: pd.DataFrame, other: pd.DataFrame | pd.MultiIndex) -> np.ndarray:
    """Whether each row's (rank, step) is one of `other`'s (a frame's rows, or the keys themselves);
    equal values of any dtype match (rank 1, step 5.0 is step 5), as tuples did."""
    return keys(df).isin(other if isinstance(other, pd.MultiIndex) else keys(other))


def pairs(items: Iterable[tuple[int, Iterable[int]]]) -> pd.MultiIndex:
    """The (rank, step) keys of each rank's steps: `(rank, steps)` items. A rank's steps as one
    array (a Python append a key was 1.7 s of a windowed pass over 256 ranks' 109 attributed
    steps each: every window asks)."""
    ranks, steps = [], []
    for rank, its in items:
        mine = np.fromiter(its, dtype=np.int64)
        ranks.append(np.full(len(mine), rank, dtype=np.int64))
        steps.append(mine)
    if not steps:
        return pd.MultiIndex.from_arrays([[], []])
    return pd.MultiIndex.from_arrays([np.concatenate(ranks), np.concatenate(steps)])


def looked_up(df: pd.DataFrame, values: pd.Series) -> np.ndarray:
    """`values` (indexed by (rank, step), each once) at each row of `df`: 0.0 where it has none, or
    NaN (`Series.map(values).fillna(0.0)` of the rows' tuples). By `RowKeys` (a binary search where
    `df`'s rows are a step frame's, in (rank, step) order): the index engine `get_indexer` built on
    `values`' keys stayed with them, 14 MiB at 256 ranks x 2,000 steps."""
    if not len(values):
        return np.zeros(len(df))
    index = values.index
    rank, step = pd.Series(index.get_level_values(0)), pd.Series(index.get_level_values(1))
    return RowKeys(df).values(rank, step, values, 0.0).astype(float)
