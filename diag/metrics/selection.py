"""A rule's selection of collectives, reduced to what the rule reads of it.

Why a reduction and not the selected rows: the windowed pass (docs/scale.md, last section) reads a
job a window of steps at a time and cannot hold every call. A rule that picks calls (the tiny ones,
a cross-node group's) names them with a `Pick` (a function of each call's own columns, so it
applies to any window's calls: `Metrics.select`) and reads only this summary:
per (rank, step) the calls' count and seconds, per op their count and bytes, per module their count,
the sizes' counts (an exact median), the ranks and the longest call. Every part sums or unites
across windows (`merge`): a step's calls all lie in its window, and the orders the rules print are
defined by counts and names, not by where a call sits in the frame.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from diag.metrics import positions

KEY = ["rank", "step"]
Pick = Callable[[pd.DataFrame], pd.Series]  # a rule's selection: `comm_frame` rows -> a mask of them
PerStep = Callable[[pd.DataFrame], pd.Series]  # `comm_frame` rows -> a figure per (rank, step) of them


@dataclass(frozen=True)
class Selected:
    """The selected calls (`comm_frame` rows), reduced. Empty-safe: `of` an empty frame."""

    calls: int
    counts: pd.Series  # (rank, step) -> calls
    sums: pd.Series  # (rank, step) -> seconds summed
    sizes: pd.Series  # bytes -> calls (sizes not recorded left out)
    kinds: pd.DataFrame  # kind (str) -> count, bytes (summed; unrecorded as 0)
    modules: pd.Series  # module (str) -> calls (unattributed left out)
    ranks: frozenset[int]
    max_dur_s: float

    @classmethod
    def of(cls, c: pd.DataFrame, keep: np.ndarray | None = None) -> Selected:
        """Reduce the calls of `Metrics.comms` that `keep` selects (all), a chunk of ranks at a time
        (`positions.rank_chunks`): the selected calls' columns are never copied whole (all ranks'
        at once were +8-11 MiB of the run's peak at 16 ranks x 1,000 steps; `calls_per_step`'s,
        +156 MiB at 64 x 1,000), and a window of one step is one chunk, not a reduction a rank."""
        parts = []
        for rows in positions.rank_chunks(pd.factorize(c["rank"], sort=True)[0]) if len(c) else []:
            part = c.iloc[rows] if keep is None else c.iloc[rows][keep[rows]]
            if len(part):
                parts.append(cls._of_ranks(part))
        return cls.merged(parts)

    @classmethod
    def _of_ranks(cls, c: pd.DataFrame) -> Selected:
        per = c[[*KEY, "dur_s"]].groupby(KEY, observed=True)["dur_s"]
        size = pd.to_numeric(c["bytes"], errors="coerce") if "bytes" in c else pd.Series(np.nan, c.index)
        moved = pd.DataFrame(
            {"rank": c["rank"], "kind": c["kind"].astype(str), "bytes": size.fillna(0).astype("float64")}
        )
        module = c["module"].dropna().astype(str) if "module" in c else pd.Series(dtype=str)
        # bytes summed a rank at a time, then over the ranks: the order the sums took a rank each
        each = moved.groupby(["rank", "kind"], observed=True)["bytes"].agg(["count", "sum"])
        return cls(
            calls=len(c),
            counts=per.size(),
            sums=per.sum(),
            sizes=size.dropna().value_counts(),
            kinds=each.groupby(level="kind").sum().rename(columns={"sum": "bytes"}),
            modules=module.value_counts(),
            ranks=frozenset(int(r) for r in c["rank"].unique()),
            max_dur_s=float(c["dur_s"].max()),
        )

    @classmethod
    def merged(cls, parts: list[Selected]) -> Selected:
        """Parts of apart (rank, step)s (ranks of one window, windows of one trace) as one."""
        if not parts:  # shaped as a rank's reduction of calls none of which is kept
            none = pd.DataFrame({"rank": [], "step": [], "dur_s": [], "bytes": [], "kind": [], "module": []})
            empty = cls._of_ranks(none.astype({"kind": "str", "module": "str"}))
            return replace(empty, counts=_joined([], "int64"), sums=_joined([], "float64"), max_dur_s=0.0)
        if len(parts) == 1:
            return parts[0]
        return cls(
            calls=sum(p.calls for p in parts),
            counts=_joined([p.counts for p in parts], "int64"),
            sums=_joined([p.sums for p in parts], "float64"),
            sizes=_added([p.sizes for p in parts]).astype("int64"),
            kinds=_added([p.kinds for p in parts]).astype({"count": "int64", "bytes": "float64"}),
            modules=_added([p.modules for p in parts]).astype("int64"),
            ranks=frozenset().union(*(p.ranks for p in parts)),
            max_dur_s=max((p.max_dur_s for p in parts), default=0.0),
        )

    def merge(self, other: Selected) -> Selected:
        """This window's and a later one's together (their (rank, step) keys are apart)."""
        return Selected.merged([self, other])

    def median_bytes(self) -> float:
        """The median of the recorded sizes over every call (as `Series.median`: the middle value,
        or the mean of the two middle ones), from their counts; NaN when none is recorded."""
        if self.sizes.empty:
            return float("nan")
        sizes = self.sizes.sort_index()
        ends = np.cumsum(sizes.to_numpy())
        n = int(ends[-1])
        values = sizes.index.to_numpy(dtype=float)
        lo = values[np.searchsorted(ends, (n - 1) // 2, side="right")]
        hi = values[np.searchsorted(ends, n // 2, side="right")]
        return float(np.mean([lo, hi]))

    def ops(self) -> dict[str, int]:
        """Calls per op, most first (ties by name)."""
        return {str(k): int(v) for k, v in _ranked(self.kinds["count"]).items()}

    def top_modules(self, n: int) -> list[str]:
        """The `n` modules that issued the most selected calls (ties by name)."""
        return [str(m) for m in _ranked(self.modules).index[:n]]


def _joined(parts: list[pd.Series], dtype: str) -> pd.Series:
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.Series(dtype=dtype, index=pd.MultiIndex.from_arrays([[], []], names=KEY))
    return pd.concat(parts) if len(parts) > 1 else parts[0]


def _added(parts: list[Any]) -> Any:
    """Counts (a Series) or sums (a frame) by their index, added."""
    held = [p for p in parts if len(p)]
    if len(held) < 2:
        return held[0] if held else parts[0]
    return pd.concat(held).groupby(level=0).sum()


def _ranked(counts: pd.Series) -> pd.Series:
    """Counts, most first, ties by name: one order whatever order the calls were read in."""
    if counts.empty:
        return counts
    order = np.lexsort((counts.index.astype(str).to_numpy(), -counts.to_numpy()))
    return counts.iloc[order]
