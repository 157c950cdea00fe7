"""Each rank's last records, read from its own rows one rank at a time: what the hang and crash
rules read (`hang_desync.last_collectives`, `last_seen`, `liveness.last_record`). A groupby of
every call by rank (or by group and rank) for each rank's last ones factorized and sorted every
call's keys at once (docs/scale.md); a trace's frames are sorted by rank, so a rank's rows are a
slice and its greatest value a `reduceat` over the slices' starts."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np
import pandas as pd

from diag.metrics import positions


def _starts(rank: pd.Series) -> np.ndarray | None:
    """Where each rank's rows begin, where the ranks are integers in ascending order (a trace's
    frames: each rank's rows a slice), else None."""
    if rank.dtype.kind not in "iu" or not rank.is_monotonic_increasing:
        return None
    return positions.starts_of(rank.to_numpy())


def rank_rows(rank: pd.Series) -> Iterator[np.ndarray | slice]:
    """Each rank's rows in turn (ascending rank): slices where the ranks are integers in ascending
    order (a trace's frames: no code per row), else index arrays."""
    starts = _starts(rank)
    if starts is None:
        yield from positions.by_rank(pd.factorize(rank, sort=True)[0])
        return
    for a, b in itertools.pairwise([*starts.tolist(), len(rank)]):
        yield slice(a, b)


def last_rows(rank: pd.Series, ts: pd.Series) -> np.ndarray:
    """Each rank's last row (greatest `ts`, the later row of equal ones; a missing `ts` counts as
    the greatest, as `argmax`'s), in rank order: a sort of a chunk of whole ranks' rows at a time
    (`positions.chunked`), not an `argmax` per rank (256 of them a window of one step)."""
    t, r = ts.to_numpy(), rank.to_numpy()
    out = []
    for rows in positions.chunked(rank_rows(rank)):
        at = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        mine = r[at]  # each rank's rows one run, ranks in order
        ends = np.append(np.flatnonzero(mine[1:] != mine[:-1]), len(at) - 1)
        run = np.zeros(len(at), np.int64)
        run[ends[:-1] + 1] = 1
        order = np.lexsort((at, t[at], np.cumsum(run)))  # by run, then time, then row
        out.append(at[order[ends]])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def max_by_rank(values: pd.Series, rank: pd.Series) -> pd.Series:
    """`values.groupby(rank).max()` (missing values skipped): over each rank's slice where the
    ranks are integers in ascending order (a trace's frames), else that groupby."""
    v = values.to_numpy()
    starts = _starts(rank) if len(v) and v.dtype.kind in "iuf" else None
    if starts is None:
        return values.groupby(rank).max()
    most = (np.fmax if v.dtype.kind == "f" else np.maximum).reduceat(v, starts)
    return pd.Series(most, index=pd.Index(rank.to_numpy()[starts], name=rank.name), name=values.name)


def latest_end(ts: pd.Series, dur: pd.Series, block: int = 1 << 16) -> float:
    """The greatest `ts + dur` (NaN where none is known), a block of rows at a time: the sum of
    every call's two columns was +26 MiB for 843,360 calls, for one number."""
    most = np.nan
    for a in range(0, len(ts), block):
        end = pd.to_numeric(ts.iloc[a : a + block], errors="coerce") + pd.to_numeric(
            dur.iloc[a : a + block], errors="coerce"
        )
        most = np.fmax(most, end.max())
    return float(most)


class Lasts(NamedTuple):
    """Per (group, rank) present, in (group, rank) order: the group's and rank's values, the
    rank's count of rows in the group and the position of its last one (greatest `ts`, the first
    row of equal ones: as `idxmax`)."""

    group: np.ndarray
    rank: np.ndarray
    count: np.ndarray
    row: np.ndarray


def last_per_group(group: pd.Series, rank: pd.Series, ts: pd.Series) -> Lasts:
    """Each rank's count of rows and last row in each group (`group` a categorical of sorted
    categories, as `text.as_text` gives, or text), a chunk of whole ranks at a time
    (`positions.chunked`: a groupby per rank cost 256 of them a window of one step): what a
    groupby of every row by (group, rank) gave (its order; rows of a missing group left out)."""
    if isinstance(group.dtype, pd.CategoricalDtype):
        gcode, names = group.cat.codes.to_numpy(), np.asarray(group.cat.categories, dtype=object)
    else:
        gcode, names = pd.factorize(group, sort=True)
        names = np.asarray(names, dtype=object)
    starts = _starts(rank)
    each: Iterable[np.ndarray | slice]
    if starts is None:
        rcode, ranks = pd.factorize(rank, sort=True)
        each = positions.by_rank(rcode)
    else:  # a slice a rank: no code per row (no factorize of every call's rank), a chunk's only
        ranks = rank.to_numpy()[starts]
        each = itertools.starmap(slice, itertools.pairwise([*starts.tolist(), len(rank)]))
    t = ts.to_numpy()
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for rows in positions.chunked(each):
        g = gcode[rows]
        keep = g >= 0
        if not keep.any():
            continue
        at = (np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows)[keep]
        code = np.searchsorted(starts, at, side="right") - 1 if starts is not None else rcode[at]
        by = pd.Series(t[rows][keep], index=at).groupby([g[keep], code], sort=True)
        count, last = by.size(), by.idxmax()
        key = count.index
        parts.append(
            (
                key.get_level_values(0).to_numpy(),
                key.get_level_values(1).to_numpy(),
                count.to_numpy(),
                last.to_numpy(),
            )
        )
    if not parts:
        empty = np.zeros(0, np.int64)
        return Lasts(names[:0], np.asarray(ranks)[:0], empty, empty)
    g, r, n, row = (np.concatenate(p) for p in zip(*parts))
    order = np.lexsort((r, g))
    return Lasts(names[g[order]], np.asarray(ranks)[r[order]], n[order], row[order])
