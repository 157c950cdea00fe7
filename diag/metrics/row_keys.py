"""A per-(rank, step) frame's rows found by their key, without a merge or a MultiIndex of its rows.

`idle.gaps` looked up a few values a (rank, step) (the seconds its calls took, the first forward of
a sampled step, the pieces of calls at a window's edge) in its step rows by merges and a MultiIndex
of every row: each a copy of the rows or an index of them, ~90 bytes a rank-step in all at the
moment that was the windowed pass's high-water mark (256 ranks x 2,000 steps). A step frame's rows
are in (rank, step) order, each key once (`steps.step_frame`): then one sorted key a row finds them
by a binary search; rows in any other order are looked up as before (a MultiIndex).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.metrics import positions
from diag.metrics.steps import in_order

_MAX_KEY = 1 << 62  # rank blocks x step span past this: the MultiIndex (no key overflows int64)
FIND_ROWS = 1 << 16  # keys searched at a time (`_Sorted.find`)


class RowKeys:
    """`frame`'s rows by (rank, step): a key's last row (as a dict of them built in row order keeps
    it), none (-1) for a key with a missing value or not in `frame`."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._rank, self._step = frame["rank"], frame["step"]
        self.size = len(frame)
        self._sorted = _sorted_keys(self._rank, self._step) if in_order(self._rank, self._step) else None
        if self._sorted is None:
            keys = pd.MultiIndex.from_arrays([self._rank, self._step])
            last = ~keys.duplicated(keep="last") & ~(self._rank.isna() | self._step.isna()).to_numpy()
            self._keys, self._rows = keys[last], np.flatnonzero(last)
            self._last = self.at(self._rank, self._step)

    def at(self, rank: pd.Series, step: pd.Series) -> np.ndarray:
        """The last row of each (rank, step), -1 where none."""
        if not len(rank):
            return np.empty(0, np.int64)
        missing = (rank.isna() | step.isna()).to_numpy()
        if self._sorted is not None:
            return self._sorted.find(rank.to_numpy(), step.to_numpy(), missing)
        found = self._keys.get_indexer(pd.MultiIndex.from_arrays([rank, step]))
        found[missing] = -1
        out = np.full(len(found), -1, np.int64)
        out[found >= 0] = self._rows[found[found >= 0]]
        return out

    def last(self, rows: np.ndarray) -> np.ndarray:
        """The last row of each of `rows`' keys (each row itself where every key is once)."""
        return rows if self._sorted is not None else self._last[rows]

    def values(self, rank: pd.Series, step: pd.Series, values: pd.Series, fill: float = np.nan) -> np.ndarray:
        """`values` of the keys (`rank`, `step`: each key once) at each row, `fill` where a row has
        none: a left merge of the rows with them, its dtype included (integers where every row has
        one), then `fillna(fill)`."""
        if self._sorted is None:  # (a key on two rows: the merge itself)
            keys = pd.DataFrame({"rank": self._rank.to_numpy(), "step": self._step.to_numpy()})
            got = pd.DataFrame({"rank": rank.to_numpy(), "step": step.to_numpy(), "v": values.to_numpy()})
            got = keys.merge(got, on=["rank", "step"], how="left")["v"]
            return got.fillna(fill).to_numpy()
        at = self.at(rank, step)
        hit = at >= 0
        filled = np.zeros(self.size, dtype=bool)
        filled[at[hit]] = True
        if filled.all():  # every row has its value: the values' dtype, as the merge keeps it
            out = np.empty(self.size, values.dtype)
        else:
            out = np.full(self.size, fill, np.result_type(values.dtype, np.float64))
        out[at[hit]] = values.to_numpy()[hit]
        if out.dtype.kind == "f" and not np.isnan(fill):  # (`fillna`: a null value too)
            out[np.isnan(out)] = fill
        return out


class _Sorted:
    """Rows in (rank, step) order, each key once: a row's key `block * span + step - low` (`block`
    its rank's among the sorted ranks), increasing, found by a binary search."""

    def __init__(self, ranks: np.ndarray, low: int, span: int, key: np.ndarray) -> None:
        self.ranks, self.low, self.span, self.key = ranks, low, span, key

    def find(self, rank: np.ndarray, step: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """Each key's row, -1 where none; `FIND_ROWS` keys at a time (a search's ten arrays of a
        key each, ~80 bytes a rank-step at once, were the straggler rule's high-water mark)."""
        out = np.full(len(rank), -1, np.int64)
        for lo in range(0, len(rank), FIND_ROWS):
            hi = lo + FIND_ROWS
            out[lo:hi] = self._find(rank[lo:hi], step[lo:hi], missing[lo:hi])
        return out

    def _find(self, rank: np.ndarray, step: np.ndarray, missing: np.ndarray) -> np.ndarray:
        out = np.full(len(rank), -1, np.int64)
        ask = np.flatnonzero(~missing)
        r, s = rank[ask], step[ask]
        good = np.ones(len(ask), bool)
        if s.dtype.kind == "f":  # a float step finds the row of its integer, if it is one
            good = s == np.floor(s)
            s = np.where(good, s, self.low).astype(np.int64)
        block = np.searchsorted(self.ranks, r)
        block = np.minimum(block, len(self.ranks) - 1)
        good &= (self.ranks[block] == r) & (s >= self.low) & (s - self.low < self.span)
        want = block.astype(np.int64) * self.span + np.where(good, s - self.low, 0)
        at = np.minimum(np.searchsorted(self.key, want), len(self.key) - 1)
        good &= self.key[at] == want
        out[ask[good]] = at[good]
        return out


def _sorted_keys(rank: pd.Series, step: pd.Series) -> _Sorted | None:
    """`_Sorted` of rows in (rank, step) order (`in_order`: integer columns), or None where a key
    would overflow, or there is no row."""
    if not len(rank):
        return None
    r, s = rank.to_numpy(), step.to_numpy()
    starts = positions.starts_of(r)  # (sorted: each rank's rows a run)
    low, span = int(s.min()), int(s.max()) - int(s.min()) + 1
    if len(starts) * span >= _MAX_KEY:
        return None
    block = np.repeat(np.arange(len(starts), dtype=np.int64), np.diff(np.r_[starts, len(r)]))
    return _Sorted(r[starts], low, span, block * span + (s - low))
