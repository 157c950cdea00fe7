"""Where each collective sits among its group's calls, on integer arrays: the k-th call of a group
on one rank matches the k-th on every other member (`comms.transfer_dur`, `comms.arrival_wait`,
`straggler.arrivals`, the `collective_mismatch` rule).

A call's position is its k (its index among its rank's calls of its group and step) computed one
rank at a time: k only orders a rank's own calls, so a sort of one rank's calls gives it, and the
temporaries are one rank's (docs/scale.md). A reduction over the members of a position (the least
duration, the latest start) then runs on a dense id per (group, step, k) with `ufunc.at`, no sort
of the whole job's calls (a lexsort of 3.4 M calls and its keys: +120 MiB). An analysis places
its calls once (`place`, `Metrics.placement`) and each reader reduces on those ids."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import numpy as np
import pandas as pd

from diag.metrics.text import as_text

_SEEN_CELLS = 50_000_000  # groups x ranks, at most, for a table of which rank is in which group


def within_runs(order: np.ndarray, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Each row's index within its run of equal `keys` in `order` (a permutation sorting by them)."""
    n = len(order)
    out = np.empty(n, np.int64)
    starts = run_starts(order, keys)
    out[order] = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
    return out


def starts_of(values: np.ndarray) -> np.ndarray:
    """Where each run of equal `values` begins (each rank's rows, where they are grouped by rank)."""
    return np.flatnonzero(np.r_[True, values[1:] != values[:-1]]) if len(values) else np.zeros(0, np.int64)


def run_starts(order: np.ndarray, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Where each run of equal `keys` begins in `order`."""
    new = np.zeros(len(order), dtype=bool)
    new[:1] = True
    for key in keys:
        sorted_key = key[order]
        new[1:] |= sorted_key[1:] != sorted_key[:-1]
    return np.flatnonzero(new)


def by_rank(rank: np.ndarray) -> Iterator[np.ndarray | slice]:
    """The rows of each rank in turn (rank codes >= 0; rows of code -1 left out): slices where
    the rows are grouped by rank already (a trace's frames are sorted by rank and time), else
    index arrays."""
    n = len(rank)
    if n and bool((rank[1:] >= rank[:-1]).all()):
        bounds = [0, *(np.flatnonzero(rank[1:] != rank[:-1]) + 1).tolist(), n]
        for a, b in itertools.pairwise(bounds):
            if rank[a] >= 0:
                yield slice(a, b)
        return
    order = np.argsort(rank, kind="stable")
    bounds = [0, *(np.flatnonzero(np.diff(rank[order])) + 1).tolist(), n]
    for a, b in itertools.pairwise(bounds):
        if a < b and rank[order[a]] >= 0:
            yield order[a:b]


# rows a chunk of ranks holds, about (`rank_chunks`): a frame, sort and groupby of every async
# call at once took +79 MiB for 843,360 calls; of this many, ~19 MiB
CHUNK_ROWS = 200_000


def rank_chunks(rank: np.ndarray, rows: int | None = None) -> Iterator[np.ndarray | slice]:
    """`by_rank`'s rows (rows of code -1 left out), ranks grouped in order until a chunk holds
    about `rows` rows (`CHUNK_ROWS`; a rank's rows never split; a window's ranks in one chunk, a
    whole trace's in a few): each chunk's rows by rank, then in row order; slices where the codes
    come grouped (a trace's frames), else index arrays. A pass per rank cost ~10 ms of pandas a
    rank a window (issue 14); a chunk's work is vectorized over its ranks, its temporaries bounded."""
    rows = rows or CHUNK_ROWS
    n = len(rank)
    if not n:
        return
    grouped = bool((rank[1:] >= rank[:-1]).all())
    order = None if grouped else np.argsort(rank, kind="stable")
    ranks = rank if order is None else rank[order]
    first = int(np.searchsorted(ranks, 0))  # rows of code -1 sort first: left out
    if first == n:
        return
    starts = np.concatenate(([first], np.flatnonzero(ranks[first + 1 :] != ranks[first:-1]) + first + 1))
    bucket = (starts - first) // rows
    bounds = [*starts[np.concatenate(([True], bucket[1:] != bucket[:-1]))].tolist(), n]
    for a, b in itertools.pairwise(bounds):
        yield slice(a, b) if order is None else order[a:b]


def chunked(ranks: Iterable[np.ndarray | slice], rows: int | None = None) -> Iterator[np.ndarray | slice]:
    """`ranks` (each rank's rows in turn, as `by_rank` gives them) joined into chunks of `rows`
    rows or more (`CHUNK_ROWS`), the last one less."""
    rows = rows or CHUNK_ROWS
    held: list[np.ndarray | slice] = []
    size = 0
    for part in ranks:
        held.append(part)
        size += part.stop - part.start if isinstance(part, slice) else len(part)
        if size >= rows:
            yield _joined(held)
            held, size = [], 0
    if held:
        yield _joined(held)


def _joined(parts: list[np.ndarray | slice]) -> np.ndarray | slice:
    """Consecutive ranks' rows as one: their slices follow each other, their arrays are joined."""
    first, last = parts[0], parts[-1]
    if isinstance(first, slice) and isinstance(last, slice):
        return slice(first.start, last.stop)
    return np.concatenate(parts) if len(parts) > 1 else first


def index_per_rank(rank: np.ndarray, ts: np.ndarray, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Each row's index among its rank's rows of equal `keys`, in `ts` order (ties in row order:
    the order the rank wrote them), one rank at a time; -1 for a row of rank code -1."""
    out = np.full(len(rank), -1, np.int32 if len(rank) < 2**31 else np.int64)
    for rows in by_rank(rank):
        mine = tuple(key[rows] for key in keys)
        order = np.lexsort((ts[rows], *reversed(mine)))
        out[rows] = within_runs(order, mine)
    return out


class Positions(NamedTuple):
    """Each call's position among its group's calls across ranks (`place`), placed once per
    analysis (`Metrics.placement`) and read by every reduction over a position's members
    (`comms.transfer_dur`, `comms.arrival_wait`, `breakdown.stragglers`; `collective_mismatch`
    reads `k`): 8 bytes a call kept, where each reader placing the calls anew took 50-60 bytes a
    call at its peak (docs/scale.md).

    `k`: a call's index among its rank's calls in its group and step, in time order (-1 where
    group or rank is missing); `ids`: a dense id per (group, step, k), -1 where the call has none
    (group or rank missing, or the members' calls in that group and step differ in number: a step
    an attach or a detach cut on each rank at its own point); `count` ids; `need`: per id, its
    group's members (`members`), the calls a position holds when every member made it."""

    k: np.ndarray
    ids: np.ndarray
    count: int
    need: np.ndarray


def place(c: pd.DataFrame, ts: pd.Series | None = None) -> Positions:
    """`c`'s calls placed by `ts` (else the frame's own): the k-th call of a group in a step on one
    rank matches the k-th of that group and step on every other member. Counted over the whole
    trace instead, one call more seen by one rank (an attach lands mid-step on each rank at its own
    point) paired every later call with the wrong one: on the real Megatron-DeepSpeed job attached
    mid-run, 53% of the TP group's positions paired calls of different sizes. Calls without a step
    are one step. Integer arrays of 4 bytes a call, the (group, step) slot its code where the
    codes are few (no hash of every call's pair)."""
    n = len(c)
    group, names = coded(as_text(c["group"]))
    rank = pd.factorize(c["rank"])[0].astype(np.int32)
    missing = (group < 0) | (rank < 0)
    group[missing] = -1
    rank[missing] = -1
    need = _known(members(group, rank), names)  # per group code
    step = pd.factorize(pd.to_numeric(c["step"]) if "step" in c else np.zeros(n))[0]
    step[step < 0] = int(step.max()) + 1 if n else 0  # no step: a step of its own
    step = step.astype(np.int32)
    k = index_per_rank(rank, numbers(c["ts"] if ts is None else ts), (group, step))
    del rank
    ok = ~missing
    if not ok.any():
        return Positions(k, np.full(n, -1, np.int32), 0, np.zeros(0, np.int64))
    whole = not missing.any()  # (the usual case: no copy of the placed calls' codes)
    del missing
    slot, slots = _slots(group if whole else group[ok], step if whole else step[ok], n)
    del step
    at = k if whole else k[ok]
    calls = np.bincount(slot, minlength=slots)
    ranks = np.bincount(slot[at == 0], minlength=slots)  # each rank's first call of the slot
    longest = np.zeros(slots, np.int64)
    np.maximum.at(longest, slot, at)
    even = (calls == ranks * (longest + 1)) & (calls > 0)  # every rank there made as many calls
    width = np.where(even, longest + 1, 0)
    del calls, ranks, longest, even
    count = int(width.sum())
    kind = np.int32 if count < 2**31 else np.int64
    offset = (np.cumsum(width) - width).astype(kind)
    ids = offset[slot]
    ids += at
    ids[width[slot] == 0] = -1
    group_of = np.zeros(slots, np.int64)
    group_of[slot] = group if whole else group[ok]
    if not whole:
        placed = np.full(n, -1, kind)
        placed[ok] = ids
        ids = placed
    return Positions(k, ids, count, np.repeat(need[group_of], width))


def _slots(group: np.ndarray, step: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """(a code per (group, step) for each call, how many codes): `group * steps + step` where
    those are few (at most `n` + 2**20), else the pairs taken, numbered in order."""
    steps = int(step.max()) + 1
    slots = (int(group.max()) + 1) * steps
    if slots <= n + 2**20:
        slot = group.astype(np.int32 if slots < 2**31 else np.int64)
        slot *= steps
        slot += step
        return slot, slots
    codes = pd.factorize(group.astype(np.int64) * steps + step)[0]
    return codes, int(codes.max()) + 1


def coded(s: pd.Series, rows: np.ndarray | None = None) -> tuple[np.ndarray, pd.Index]:
    """(an int32 code per value (of `rows` only, given them), -1 where missing; the values coded,
    sorted): a categorical's own codes where its categories are sorted (no int64 array of them)."""
    if isinstance(s.dtype, pd.CategoricalDtype) and s.cat.categories.is_monotonic_increasing:
        codes = s.cat.codes.to_numpy()
        return (codes if rows is None else codes[rows]).astype(np.int32), s.cat.categories
    codes, names = pd.factorize(s if rows is None else s.iloc[rows], sort=True)
    return codes.astype(np.int32), pd.Index(names)


def numbers(values: pd.Series) -> np.ndarray:
    """A numeric column as numpy: integers as they are (ns timestamps lose their last bits as
    floats), floats with NaN where missing."""
    num = pd.to_numeric(values)
    if num.dtype.kind in "iu" and not num.isna().any():
        return num.to_numpy(np.int64)
    return num.to_numpy(dtype=float, na_value=np.nan)


_KNOWN: ContextVar[Mapping[str, int] | None] = ContextVar("known_members", default=None)


@contextmanager
def known_members(counts: Mapping[str, int]) -> Iterator[None]:
    """Within: each group's members are `counts[group]` (the whole trace's) where the calls placed
    show fewer. A window of steps in which a member made no call in a group would otherwise count
    a position full that the whole trace counts short (`need`), and give a transfer time where the
    whole trace gives none (`windowed_stage`: each window's reductions)."""
    token = _KNOWN.set(counts)
    try:
        yield
    finally:
        _KNOWN.reset(token)


def _known(need: np.ndarray, names: pd.Index) -> np.ndarray:
    known = _KNOWN.get()
    if known is None or not len(need):
        return need
    whole = np.array([known.get(str(g), 0) for g in names[: len(need)]], dtype=need.dtype)
    return np.maximum(need, whole)


def members(group: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per group code: how many distinct ranks made calls in it."""
    ok = group >= 0
    if not ok.any():
        return np.zeros(0, np.int64)
    groups, width = int(group.max()) + 1, int(rank.max()) + 1
    pairs = group.astype(np.int64) if ok.all() else group[ok].astype(np.int64)
    pairs *= width
    pairs += rank if ok.all() else rank[ok]
    if groups * width <= _SEEN_CELLS:
        seen = np.zeros(groups * width, dtype=bool)
        seen[pairs] = True
        return seen.reshape(groups, width).sum(axis=1)
    return np.bincount(np.unique(pairs) // width, minlength=groups)
