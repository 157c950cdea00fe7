"""Where each collective sits among its group's calls, on integer arrays: the k-th call of a group
on one rank matches the k-th on every other member (`comms.transfer_dur`, `comms.arrival_wait`,
the `collective_mismatch` rule). A groupby's keys and a sorted copy of the frame cost 100-190 bytes
a call at their peak (docs/scale.md); a few int64 arrays cost 8 bytes each."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.metrics.text import as_text


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


def in_group(c: pd.DataFrame, ts: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group code, rank code, k) of each call, k its index among its rank's calls in its group in
    `ts` order (the order `sort_values("ts")` gives, ties included): what `groupby([rank,
    group]).cumcount()` of the calls so sorted gives; -1 for all three where the group or the rank
    is missing."""
    n = len(c)
    by_ts = pd.DataFrame({"ts": ts.reset_index(drop=True)}).sort_values("ts").index.to_numpy()
    issued = np.empty(n, np.int64)
    issued[by_ts] = np.arange(n)
    del by_ts
    group = pd.factorize(as_text(c["group"]))[0]
    rank = pd.factorize(c["rank"])[0]
    order = np.lexsort((issued, rank, group))
    del issued
    k = within_runs(order, (group, rank))
    missing = (group < 0) | (rank < 0)
    k[missing] = -1
    group[missing] = -1
    rank[missing] = -1
    return group, rank, k


def per_position(group: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, starts, sizes): the calls with a position, sorted by (group, k); where each
    position's calls begin in that order, and how many they are."""
    rows = np.flatnonzero(group >= 0)
    order = rows[np.lexsort((k[rows], group[rows]))]
    starts = run_starts(order, (group, k))
    return order, starts, np.diff(np.append(starts, len(order)))


def members(group: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per group code: how many distinct ranks made calls in it."""
    ok = group >= 0
    if not ok.any():
        return np.zeros(0, np.int64)
    width = int(rank.max()) + 1
    pairs = np.unique(group[ok].astype(np.int64) * width + rank[ok])
    return np.bincount(pairs // width, minlength=int(group.max()) + 1)
