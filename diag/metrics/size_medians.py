"""`bandwidth_by_size` (the median bus bandwidth per op and message size) of a trace read a window of
steps at a time: an exact median of every call's busbw, which no per-window figure keeps.

Why two reductions: busbw follows each call's duration, so its values do not repeat and their
counts do not reduce. The first (`SizeBins`, early: it reads each call's own columns) counts each
(op, size)'s values in bins of their float64 bits (a bin: 1/256 of an octave), which says in which
bin the middle values lie; the second (`SizeMiddle`) keeps only the values of those bins, a few per
(op, size), each distinct value once with its count, and the median is read among them: the same
order statistics, the same arithmetic as `breakdown.by_size`, so the same floats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diag.metrics import reduction
from diag.metrics.breakdown import BY_SIZE_COLUMNS
from diag.metrics.comms import between_ranks
from diag.metrics.text import as_text

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics

SHIFT = 44  # a bin: the float64s sharing their top 20 bits (sign, exponent, 8 of the fraction)
_KEY = ["op", "bytes", "bin"]
_NO_BIN = np.iinfo(np.int64).min  # a call of no busbw: counted in `calls`, not in the median


def _sized(metrics: Metrics) -> pd.DataFrame:
    """op (text), bytes (> 0), busbw of the calls between ranks, as `breakdown.by_size` reads them."""
    c = between_ranks(metrics.trace.comms)
    if c.empty or "bytes" not in c or "busbw" not in c:
        return pd.DataFrame({"op": [], "bytes": [], "busbw": []})
    size = pd.to_numeric(c["bytes"], errors="coerce")
    keep = (size > 0).to_numpy() & as_text(c["op"]).notna().to_numpy()
    return pd.DataFrame(
        {
            "op": as_text(c["op"]).to_numpy()[keep].astype(str),
            "bytes": size.to_numpy()[keep],
            "busbw": c["busbw"].to_numpy(dtype=float, na_value=np.nan)[keep],
        }
    )


def _bins(busbw: np.ndarray) -> np.ndarray:
    """Each value's bin, in the values' order (the bits of a float64 made a signed total order)."""
    bits = np.where(np.isnan(busbw), 0.0, busbw).view(np.int64)
    ordered = bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))
    return np.where(np.isnan(busbw), _NO_BIN, ordered >> SHIFT)


@dataclass(frozen=True)
class SizeBins:
    """Per (op, size, bin): how many calls. The bin of no busbw (`_NO_BIN`) counts calls alone."""

    def of(self, metrics: Metrics) -> pd.DataFrame:
        c = _sized(metrics)
        c["bin"] = _bins(c["busbw"].to_numpy())
        out = c.groupby(_KEY, sort=False).size().rename("n").reset_index()
        sizes = metrics.trace.comms["bytes"] if "bytes" in metrics.trace.comms else pd.Series(dtype=float)
        return out.assign(integral=sizes.dtype.kind in "iu" or sizes.empty)

    def merged(self, parts: list[pd.DataFrame]) -> pd.DataFrame:
        rows = [p for p in parts if len(p)]
        if not rows:
            return pd.DataFrame({"op": [], "bytes": [], "bin": [], "n": [], "integral": []})
        both = pd.concat(rows, ignore_index=True)
        integral = bool(both["integral"].all())  # (a window of a missing size: float sizes, as whole)
        out = both.drop(columns="integral").groupby(_KEY, sort=True).sum().reset_index()
        return out.assign(integral=integral)

    folds = True  # (its merged value is a part: the windowed pass joins them as it goes)


@dataclass(frozen=True)
class SizeMiddle:
    """The busbw values of the bins `wanted` names ((op, size, bin) triples), each distinct one once
    with its calls (`n`), sorted. Counts, not a row a call: a job's calls repeat their durations
    (the tiled trace's, its steps' calls alike), and counts add across windows."""

    wanted: frozenset[tuple[str, float, int]]

    def of(self, metrics: Metrics) -> pd.DataFrame:
        c = _sized(metrics)
        c["bin"] = _bins(c["busbw"].to_numpy())
        keys = pd.MultiIndex.from_frame(c[_KEY])
        want = pd.MultiIndex.from_tuples(sorted(self.wanted), names=_KEY) if self.wanted else keys[:0]
        return _counted(c[keys.isin(want)])

    def merged(self, parts: list[pd.DataFrame]) -> pd.DataFrame:
        rows = [p for p in parts if len(p)]
        if not rows:
            return _counted(pd.DataFrame({"op": [], "bytes": [], "busbw": [], "bin": []}))
        if len(rows) == 1:
            return rows[0]
        both = pd.concat(rows, ignore_index=True)
        return both.groupby([*_KEY, "busbw"], sort=True)["n"].sum().reset_index()

    folds = True  # (its merged value is a part: calls counted per value, added)


def _counted(c: pd.DataFrame) -> pd.DataFrame:
    """The calls `c` (op, bytes, busbw, bin) as their distinct (op, bytes, bin, busbw)s, sorted, and
    how many calls each (`n`)."""
    return c.groupby([*_KEY, "busbw"], sort=True).size().rename("n").reset_index()


def wanted(bins: pd.DataFrame) -> frozenset[tuple[str, float, int]]:
    """The (op, size, bin)s holding each (op, size)'s middle value(s)."""
    out = set()
    for (op, size), mine in bins[bins["bin"] != _NO_BIN].groupby(["op", "bytes"], sort=False):
        for b in _middle_bins(mine["bin"].to_numpy(), mine["n"].to_numpy())[0]:
            out.add((str(op), float(size), int(b)))
    return frozenset(out)


def _middle_bins(b: np.ndarray, n: np.ndarray) -> tuple[list[int], list[int], int]:
    """(the bins of the order statistics the median reads, each one's rank within its bin, count)."""
    order = np.argsort(b, kind="stable")
    b, n = b[order], n[order]
    ends = np.cumsum(n)
    total = int(ends[-1]) if len(ends) else 0
    k = total // 2
    ranks = [k] if total % 2 else [k - 1, k]
    at = [int(np.searchsorted(ends, r, side="right")) for r in ranks]
    return [int(b[i]) for i in at], [r - int(ends[i] - n[i]) for r, i in zip(ranks, at)], total


def frame(bins: pd.DataFrame, middle: pd.DataFrame) -> pd.DataFrame:
    """`breakdown.bandwidth_by_size`'s frame from the two reductions (the sizes int64 where every
    window's were: the whole trace's column then held no missing size)."""
    if bins.empty:
        return pd.DataFrame(columns=BY_SIZE_COLUMNS)
    values = {
        k: (g["busbw"].to_numpy(), np.cumsum(g["n"].to_numpy())) for k, g in middle.groupby(_KEY, sort=False)
    }
    rows = []
    for (op, size), mine in bins.groupby(["op", "bytes"], sort=True):
        calls = int(mine["n"].sum())
        known = mine[mine["bin"] != _NO_BIN]
        median = np.nan
        if len(known):
            at, within, _ = _middle_bins(known["bin"].to_numpy(), known["n"].to_numpy())
            held = [values.get((op, size, b)) for b in at]  # (none in a learning run: `settle`)
            got = [_nth(*v, i) if v is not None else np.nan for v, i in zip(held, within)]
            median = got[0] if len(got) == 1 else float((np.float64(got[1]) + np.float64(got[0])) / 2)
        rows.append((str(op), size, median, calls))
    out = pd.DataFrame(rows, columns=BY_SIZE_COLUMNS)
    out["busbw"] = out["busbw"].astype(float)
    out["calls"] = out["calls"].astype(np.int64)
    if bool(bins["integral"].all()):
        out["bytes"] = out["bytes"].astype(np.int64)
    return out


def _nth(values: np.ndarray, ends: np.ndarray, i: int) -> float:
    """The `i`-th (from 0) of the sorted distinct `values` counted to `ends` (cumulative counts)."""
    return float(values[np.searchsorted(ends, i, side="right")])


def of_windows(metrics: Metrics) -> pd.DataFrame:
    """`bandwidth_by_size` from the reductions (the windowed pass's `Metrics`)."""
    bins = metrics.reduce(SizeBins())
    return frame(bins, metrics.reduce(SizeMiddle(wanted(bins))))


reduction.early(lambda _trace: SizeBins())
