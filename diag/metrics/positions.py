"""Where each collective sits among its group's calls, on integer arrays: the k-th call of a group
on one rank matches the k-th on every other member (`comms.transfer_dur`, `comms.arrival_wait`,
`straggler.arrivals`, the `collective_mismatch` rule).

A call's position is a compact key (group code, rank code, k: three int32, 12 bytes a call)
computed one rank at a time: k only orders a rank's own calls, so a sort of one rank's calls
gives it, and the temporaries are one rank's (docs/scale.md). A reduction over the members of a
position (the least duration, the latest start) then runs on a dense id per (group, k) with
`ufunc.at`, no sort of the whole job's calls (a lexsort of 3.4 M calls and its keys: +120 MiB)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
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


def index_per_rank(rank: np.ndarray, ts: np.ndarray, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Each row's index among its rank's rows of equal `keys`, in `ts` order (ties in row order:
    the order the rank wrote them), one rank at a time; -1 for a row of rank code -1."""
    out = np.full(len(rank), -1, np.int32 if len(rank) < 2**31 else np.int64)
    for rows in by_rank(rank):
        mine = tuple(key[rows] for key in keys)
        order = np.lexsort((ts[rows], *reversed(mine)))
        out[rows] = within_runs(order, mine)
    return out


class Placed(NamedTuple):
    """Each call's place among its group's calls of its step (`in_step`): group and rank codes, k
    (its index among its rank's calls in that group and step, in time order) and `slot`, a code
    per (group, step) that holds it, -1 where the call has no place: group or rank missing, or the
    members' calls in that group and step differ in number (a step an attach or a detach cut on
    each rank at its own point)."""

    group: np.ndarray
    rank: np.ndarray
    k: np.ndarray
    slot: np.ndarray


def in_step(c: pd.DataFrame, ts: pd.Series) -> Placed:
    """The k-th call of a group in a step on one rank matches the k-th of that group and step on
    every other member. Counted over the whole trace instead, one call more seen by one rank (an
    attach lands mid-step on each rank at its own point) paired every later call with the wrong
    one: on the real Megatron-DeepSpeed job attached mid-run, 53% of the TP group's positions paired
    calls of different sizes. Calls without a step are one step."""
    group = coded(as_text(c["group"]))[0]
    rank = pd.factorize(c["rank"])[0].astype(np.int32)
    missing = (group < 0) | (rank < 0)
    group[missing] = -1
    rank[missing] = -1
    step = pd.factorize(pd.to_numeric(c["step"]) if "step" in c else np.zeros(len(c)))[0]
    step[step < 0] = int(step.max()) + 1 if len(step) else 0  # no step: a step of its own
    k = index_per_rank(rank, numbers(ts), (group, step))
    slot = np.full(len(c), -1, np.int64)
    if len(c) and not missing.all():
        pair = group.astype(np.int64) * (int(step.max()) + 1) + step
        codes = pd.factorize(pair[~missing])[0]
        slot[~missing] = codes
        n = int(codes.max()) + 1
        calls = np.bincount(codes, minlength=n)
        ranks = np.bincount(codes[k[~missing] == 0], minlength=n)  # each rank's first call of the slot
        longest = np.zeros(n, np.int64)
        np.maximum.at(longest, codes, k[~missing])
        even = calls == ranks * (longest + 1)  # every rank there made as many calls
        slot[~missing] = np.where(even[codes], codes, -1)
    return Placed(group, rank, k, slot)


class Positions(NamedTuple):
    """Each call's position among its group's calls across ranks, placed once (`place`) and read
    by every reduction over a position's members (`comms.transfer_dur`, `comms.arrival_wait`,
    `breakdown.stragglers`; `collective_mismatch` reads `k`): 8 bytes a call kept, where each
    reader placing the calls anew took 50-60 bytes a call at its peak (docs/scale.md).

    `k`: `in_step`'s (-1 where group or rank is missing); `ids`: a dense id per (group, step, k)
    (`position_ids` of `in_step`'s slot), -1 where the call has none; `count` ids; `need`: per id,
    its group's members (`members`), the calls a position holds when every member made it."""

    k: np.ndarray
    ids: np.ndarray
    count: int
    need: np.ndarray


def place(c: pd.DataFrame, ts: pd.Series | None = None) -> Positions:
    """`c`'s calls placed (`in_step`, by `ts`, else the frame's own `ts`) as `Positions`."""
    placed = in_step(c, c["ts"] if ts is None else ts)
    ids, count = position_ids(placed.slot, placed.k)
    need = members(placed.group, placed.rank)[group_of(ids, placed.group, count)]
    return Positions(placed.k, ids.astype(np.int32) if count < 2**31 else ids, count, need)


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


def position_ids(group: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, int]:
    """(a dense id per (group, k) for each call, -1 where it has none; how many ids): the group's
    offset plus k, so a reduction per position is a `ufunc.at` into an array of that length."""
    placed = group >= 0
    if not placed.any():
        return np.full(len(group), -1, np.int64), 0
    whole = bool(placed.all())  # (the usual case: no copy of the placed calls' codes)
    g, at = (group, k) if whole else (group[placed], k[placed])
    width = np.zeros(int(g.max()) + 1, np.int64)
    np.maximum.at(width, g, at)
    width += 1  # a group's largest k + 1 (0 for a code no call has: 1 spare id, never taken)
    offset = np.concatenate(([0], np.cumsum(width)[:-1]))
    ids = offset[g]
    ids += at
    if not whole:
        out = np.full(len(group), -1, np.int64)
        out[placed] = ids
        ids = out
    return ids, int(width.sum())


def group_of(ids: np.ndarray, group: np.ndarray, count: int) -> np.ndarray:
    """The group code of each position id (0 for an id no call has)."""
    out = np.zeros(count, np.int64)
    placed = ids >= 0
    if placed.all():
        out[ids] = group
    else:
        out[ids[placed]] = group[placed]
    return out


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
