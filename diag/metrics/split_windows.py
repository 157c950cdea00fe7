"""`Metrics.step_split` of a diag trace one window of steps at a time (`metrics.windowed`).

A step's split clips every interval of its rank (calls, module records) to the step's span: by
time, not by the step a record names, so a call that runs past its step's end, or a module record
of the next step that begins before it, counts there. Each window's steps are split when the next
window has come (its records that begin before they end are then in), with the records of earlier
windows that end after the first of them begins (the carry); per (rank, step) only the parts of
`step_split.split_steps` are kept, and each rank's row is made from its steady ones at the end. Exact
where no record of window k + 2 lies in a step of window k (a record overlaps the steps next to
its own); the records of no step (`outside`) that lie in a step split before they came are
counted in `missed`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from diag.metrics import positions, step_split

FOLD = 32  # windows' parts held one by one before they are joined (a concat or a groupby each time)


def fold(parts: list[Any], join: Callable[[list[Any]], Any]) -> None:
    """`parts` as one (`join`) once FOLD windows' are held: a window's small frames and series
    held one by one cost their objects' overhead each (8 ranks x 4,000 steps in windows of 10: the
    peak grew 2.7 KB a rank-step against the ~160 bytes the reductions hold). `join` keeps their
    order, so the last join is the same."""
    if len(parts) >= FOLD:
        parts[:] = [join([p for p in parts if len(p)] or parts[:1])]


PARTS = step_split.PARTS
_COMM = ("rank", "ts", "dur", "async_op", "group")
_LAYER = ("rank", "ts", "dur")


class SplitWindows:
    """Takes each window's calls between ranks, module records and steps (`steps.step_frame`)."""

    def __init__(self) -> None:
        self._comms: pd.DataFrame | None = None  # records that may lie in a step not split yet
        self._layers: pd.DataFrame | None = None
        self._pending: pd.DataFrame | None = None  # the last window's steps
        self._parts: list[pd.DataFrame] = []  # per (rank, step) split: PARTS
        self._sampled: list[pd.DataFrame] = []  # (rank, step)s with module records
        self._known: set = set()  # ranks with a sampled step past their first
        self._first: dict = {}  # rank -> its first step
        self.missed = 0

    def add(self, comms: pd.DataFrame, layers: pd.DataFrame, steps: pd.DataFrame) -> None:
        self._take(comms, layers)
        self._split()
        self._pending = self._wanted(steps, layers)
        self._drop_done()

    def done(
        self, comms: pd.DataFrame, layers: pd.DataFrame, steps: pd.DataFrame, every: pd.DataFrame
    ) -> None:
        """After the last window: `comms`, `layers` and `steps` (`step_frame`) the records of no
        step, `every` the whole step frame."""
        self.missed = _overlapping(comms, every, self._split_keys()) + _overlapping(
            layers, every, self._split_keys()
        )
        self._take(comms, layers)
        self._split()
        self._pending = self._wanted(steps, layers)
        self._split()

    def _wanted(self, steps: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
        """The steps a rank's row may read: its sampled ones (with module records), and the
        others until it has a sampled one past its first step (its warm-up, never steady where
        later ones are): from then on its row reads only sampled steps."""
        if not len(steps):
            return steps
        first = steps.groupby("rank")["step"].min()  # windows come in step order: a rank's first
        self._first.update(first[~first.index.isin(list(self._first))].to_dict())
        sampled = layers[["rank", "step"]].drop_duplicates() if len(layers) else None
        if sampled is None:
            return steps[~steps["rank"].isin(self._known).to_numpy()]
        self._sampled.append(sampled)
        fold(self._sampled, pd.concat)
        keys = pd.MultiIndex.from_frame(steps[["rank", "step"]])
        # a sampled step with a span (a step record of no duration is no step of the split)
        later = (sampled["step"].to_numpy() > sampled["rank"].map(self._first).to_numpy()) & (
            pd.MultiIndex.from_frame(sampled).isin(keys)
        )
        wanted = keys.isin(pd.MultiIndex.from_frame(sampled)) | ~steps["rank"].isin(self._known).to_numpy()
        self._known.update(sampled["rank"][later].tolist())  # (this window's others are split)
        return steps[wanted]

    def frame(self, steady: pd.DataFrame) -> pd.DataFrame:
        """`step_split.step_split`'s frame of a diag trace (no GPU timeline): one row per rank
        with steady steps (`steady`); its sampled steps those with module records."""
        if steady.empty or not self._parts:
            return pd.DataFrame([], columns=step_split.COLUMNS)
        parts = self._parts[0] if len(self._parts) == 1 else pd.concat(self._parts, ignore_index=True)
        self._parts = [parts]  # (the windows' parts held once)
        sampled = pd.concat(self._sampled) if self._sampled else pd.DataFrame(columns=["rank", "step"])
        rows = []
        for st, mine, seen in _by_rank_chunks(steady, parts, sampled):
            rows += _rows(st, mine, seen)
        return pd.DataFrame(rows, columns=step_split.COLUMNS)

    def kept(self) -> int:
        return int(sum(f.memory_usage(deep=True).sum() for f in [*self._parts, *self._sampled]))

    def carried(self) -> int:
        """Bytes of the records held for the steps not split yet (about a window's)."""
        frames = [f for f in (self._comms, self._layers) if f is not None]
        return int(sum(f.memory_usage(deep=True).sum() for f in frames))

    def _take(self, comms: pd.DataFrame, layers: pd.DataFrame) -> None:
        self._comms = _joined(self._comms, comms, _COMM)
        self._layers = _joined(self._layers, layers, _LAYER)

    def _split(self) -> None:
        """Split the pending steps on the records taken so far."""
        st = self._pending
        if st is None or st.empty or self._comms is None or self._layers is None:
            return
        self._parts.append(step_split.split_steps(st, self._comms, self._layers))
        fold(self._parts, lambda parts: pd.concat(parts, ignore_index=True))
        self._pending = None

    def _split_keys(self) -> pd.MultiIndex:
        if not self._parts:
            return pd.MultiIndex.from_arrays([[], []], names=["rank", "step"])
        return pd.MultiIndex.from_frame(pd.concat([p[["rank", "step"]] for p in self._parts]))

    def _drop_done(self) -> None:
        """Keep only the records that end after the earliest pending step of their rank begins (a
        rank with no pending step keeps its records: its next steps may lie under them)."""
        st = self._pending
        if st is None or st.empty:
            return
        first = st.groupby("rank")["start"].min()
        for name in ("_comms", "_layers"):
            df = getattr(self, name)
            if df is not None and len(df):
                end = pd.to_numeric(df["ts"]) + pd.to_numeric(df["dur"])
                begin = df["rank"].map(first)
                setattr(self, name, df[(begin.isna() | (end > begin)).to_numpy()].reset_index(drop=True))


def _rows(steady: pd.DataFrame, parts: pd.DataFrame, sampled: pd.DataFrame) -> list[dict[str, object]]:
    """`step_split.split_rows` of the `parts` of the `steady` steps (rank, step), those with module
    records (`sampled`) read where a rank has some."""
    parts = steady[["rank", "step"]].merge(parts, on=["rank", "step"], how="left")
    keys = pd.MultiIndex.from_frame(parts[["rank", "step"]])
    parts["sampled"] = keys.isin(pd.MultiIndex.from_frame(sampled))
    use, known = step_split.sampled_use(parts["rank"], parts["sampled"].to_numpy())
    return step_split.split_rows(parts[use], known[use])


def _by_rank_chunks(
    steady: pd.DataFrame, parts: pd.DataFrame, sampled: pd.DataFrame
) -> Iterator[tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]]:
    """The three frames' rows of a chunk of ranks at a time (`positions.CHUNK_ROWS` steady steps,
    a rank's never split), in rank order: a rank's row reads its own rows only, and its sums are
    integers, so the rows are those of the whole frames at once, whose merge and keys held ~250
    bytes a rank-step (the first pass's end at 256 ranks x 2,000 steps). The whole frames at once
    where a rank is missing or the steady steps are not in rank order."""
    rank = steady["rank"].to_numpy()
    others = [df["rank"].to_numpy() for df in (parts, sampled)]
    integers = rank.dtype.kind in "iu" and all(r.dtype.kind in "iu" or not len(r) for r in others)
    if not integers or (rank[1:] < rank[:-1]).any():
        yield steady, parts, sampled
        return
    starts = positions.starts_of(rank)
    orders = [np.argsort(r, kind="stable") for r in others]
    sorted_ranks = [r[o] for r, o in zip(others, orders)]
    first = 0
    while first < len(starts):
        last = int(np.searchsorted(starts, starts[first] + positions.CHUNK_ROWS, side="left"))
        last = max(last, first + 1)  # (ranks first..last-1)
        lo, hi = rank[starts[first]], rank[starts[last - 1]]
        end = starts[last] if last < len(starts) else len(rank)
        picked = []
        for df, order, keys in zip((parts, sampled), orders, sorted_ranks):
            a, b = np.searchsorted(keys, lo, side="left"), np.searchsorted(keys, hi, side="right")
            picked.append(df.iloc[np.sort(order[a:b])])
        yield steady.iloc[starts[first] : end], picked[0], picked[1]
        first = last


def _joined(held: pd.DataFrame | None, more: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """`held` and `more`'s `columns` (those it has), as one frame."""
    more = more[[c for c in columns if c in more.columns]]
    if held is None or not len(held):
        return more.reset_index(drop=True)
    if not len(more):
        return held
    return pd.concat([held, more], ignore_index=True)


def _overlapping(df: pd.DataFrame, every: pd.DataFrame, split: pd.MultiIndex) -> int:
    """How many of `df`'s records lie in a step of `every` that was split already (`split`)."""
    if df.empty or every.empty or not len(split):
        return 0
    done = every[pd.MultiIndex.from_frame(every[["rank", "step"]]).isin(split)]
    ts = pd.to_numeric(df["ts"]).to_numpy(dtype=float)
    end = ts + pd.to_numeric(df["dur"]).to_numpy(dtype=float)
    count = 0
    for rank, spans in done.groupby("rank"):
        mine = (df["rank"] == rank).to_numpy()
        starts, ends = spans["start"].to_numpy(dtype=float), spans["end"].to_numpy(dtype=float)
        hit = (ts[mine, None] < ends[None, :]) & (end[mine, None] > starts[None, :])
        count += int(hit.any(axis=1).sum())
    return count
