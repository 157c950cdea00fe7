"""`row_keys.RowKeys`: a step frame's rows found by (rank, step) as the merges and the MultiIndex
of every row that `idle.gaps` used found them, in (rank, step) order (a binary search of one key a
row) and in any other order (the MultiIndex, kept)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.metrics.row_keys import RowKeys

NAN = float("nan")


def _last_rows(frame: pd.DataFrame, rank: pd.Series, step: pd.Series) -> np.ndarray:
    """A dict of the rows' keys built in row order (a key's last row), asked for each key."""
    last = {}
    for i, (r, s) in enumerate(zip(frame["rank"], frame["step"], strict=True)):
        if not (pd.isna(r) or pd.isna(s)):
            last[(float(r), float(s))] = i
    return np.array(
        [-1 if pd.isna(r) or pd.isna(s) else last.get((float(r), float(s)), -1) for r, s in zip(rank, step)],
        dtype=np.int64,
    )


def _merged(frame: pd.DataFrame, keys: pd.DataFrame, fill: float) -> pd.Series:
    return frame[["rank", "step"]].merge(keys, on=["rank", "step"], how="left")["v"].fillna(fill)


_FRAMES = st.lists(st.tuples(st.integers(0, 4), st.integers(-2, 9)), max_size=25)
_ASKED = st.lists(
    st.tuples(
        st.one_of(st.integers(-1, 5), st.just(NAN)),
        st.one_of(st.integers(-3, 11), st.just(NAN), st.sampled_from([0.5, 2.0, 3.25])),
    ),
    max_size=20,
)


@settings(max_examples=300, deadline=None)
@given(_FRAMES, st.booleans(), _ASKED)
def test_rows_of_keys_are_a_dicts_last_row(rows, in_order, asked):
    """Sorted (each key once), or in any order with keys twice; asked keys null, absent, of a
    float step (its integer's row where it is one)."""
    frame = pd.DataFrame(rows, columns=["rank", "step"], dtype="int64")
    if in_order:
        frame = frame.drop_duplicates().sort_values(["rank", "step"], ignore_index=True)
    q = pd.DataFrame(asked, columns=["rank", "step"])
    keys = RowKeys(frame)
    np.testing.assert_array_equal(keys.at(q["rank"], q["step"]), _last_rows(frame, q["rank"], q["step"]))
    every = np.arange(len(frame))
    np.testing.assert_array_equal(keys.last(every), _last_rows(frame, frame["rank"], frame["step"]))


@settings(max_examples=200, deadline=None)
@given(_FRAMES, _ASKED)
def test_keys_searched_a_few_at_a_time_find_the_same_rows(rows, asked):
    """`FIND_ROWS` keys a search (the chunks' bounds anywhere among the keys asked: every row's
    own, then others): the same rows."""
    import pytest

    from diag.metrics import row_keys

    frame = pd.DataFrame(rows, columns=["rank", "step"], dtype="int64")
    frame = frame.drop_duplicates().sort_values(["rank", "step"], ignore_index=True)
    q = pd.concat([frame[::-1], pd.DataFrame(asked, columns=["rank", "step"])], ignore_index=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(row_keys, "FIND_ROWS", 3)
        got = RowKeys(frame).at(q["rank"], q["step"])
    np.testing.assert_array_equal(got, _last_rows(frame, q["rank"], q["step"]))


@settings(max_examples=300, deadline=None)
@given(_FRAMES, st.booleans(), st.data(), st.sampled_from([NAN, 0.0]), st.booleans())
def test_values_at_rows_are_a_left_merges(rows, in_order, data, fill, ints):
    """Each key once among the values; some of the rows' keys, none, or all (then integers stay
    integers, as the merge keeps them); null values filled as `fillna` fills them."""
    frame = pd.DataFrame(rows, columns=["rank", "step"], dtype="int64")
    if in_order:
        frame = frame.drop_duplicates().sort_values(["rank", "step"], ignore_index=True)
    known = sorted(set(zip(frame["rank"], frame["step"], strict=True)))
    extra = data.draw(st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 11)), max_size=6))
    picked = (
        data.draw(st.sets(st.sampled_from(known))) if known and not data.draw(st.booleans()) else set(known)
    )
    pairs = sorted(picked | set(extra))
    vals = data.draw(
        st.lists(st.one_of(st.integers(0, 99), st.just(NAN)), min_size=len(pairs), max_size=len(pairs))
    )
    keys = pd.DataFrame(pairs, columns=["rank", "step"], dtype="int64").assign(v=pd.Series(vals, dtype=float))
    if ints:
        keys = keys.dropna().astype({"v": "int64"})
    keys = keys.sample(frac=1, random_state=0)  # (in no order)
    by_key = keys.set_index(["rank", "step"])["v"]  # (as `rank_steps.looked_up` has them)
    asked = (pd.Series(by_key.index.get_level_values(i)) for i in (0, 1))
    got = RowKeys(frame).values(*asked, by_key, fill)
    want = _merged(frame, keys, fill)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want.to_numpy())
