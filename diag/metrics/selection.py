"""A rule's selection of collectives, reduced to what the rule reads of it.

Why a reduction and not the selected rows: the windowed pass (docs/scale.md, last section) reads a
job a window of steps at a time and cannot hold every call. A rule that picks calls (the tiny ones,
a cross-node group's) names them with a mask over `Metrics.comms` and reads only this summary:
per (rank, step) the calls' count and seconds, per op their count and bytes, per module their count,
the sizes' counts (an exact median), the ranks and the longest call. Every part sums or unites
across windows (`merge`): a step's calls all lie in its window, and the orders the rules print are
defined by counts and names, not by where a call sits in the frame.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diag.metrics import positions

KEY = ["rank", "step"]
Pick = Callable[[pd.DataFrame], pd.Series]  # a rule's selection: `comm_frame` rows -> a mask of them


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
    def of(cls, c: pd.DataFrame) -> Selected:
        """Reduce the selected rows of `Metrics.comms` (one rank at a time, as `calls_per_step`:
        every rank's selected calls and their groupby keys at once were +156 MiB at 64 ranks x
        1,000 steps)."""
        counts, sums = [], []
        for rows in positions.by_rank(pd.factorize(c["rank"], sort=True)[0]) if len(c) else []:
            per = c.iloc[rows][[*KEY, "dur_s"]].groupby(KEY, observed=True)["dur_s"]
            counts.append(per.size())
            sums.append(per.sum())
        size = pd.to_numeric(c["bytes"], errors="coerce") if "bytes" in c else pd.Series(dtype=float)
        kind = c["kind"].astype(str) if len(c) else pd.Series(dtype=str)
        moved = pd.DataFrame({"kind": kind, "bytes": size.fillna(0).astype("float64")})
        kinds = moved.groupby("kind")["bytes"].agg(["count", "sum"])
        module = c["module"].dropna().astype(str) if "module" in c else pd.Series(dtype=str)
        return cls(
            calls=len(c),
            counts=_joined(counts, "int64"),
            sums=_joined(sums, "float64"),
            sizes=size.dropna().value_counts(),
            kinds=kinds.rename(columns={"sum": "bytes"}),
            modules=module.value_counts(),
            ranks=frozenset(int(r) for r in c["rank"].unique()) if len(c) else frozenset(),
            max_dur_s=float(c["dur_s"].max()) if len(c) else 0.0,
        )

    def merge(self, other: Selected) -> Selected:
        """This window's and a later one's together (their (rank, step) keys are apart)."""
        return Selected(
            calls=self.calls + other.calls,
            counts=_joined([self.counts, other.counts], "int64"),
            sums=_joined([self.sums, other.sums], "float64"),
            sizes=self.sizes.add(other.sizes, fill_value=0).astype("int64"),
            kinds=self.kinds.add(other.kinds, fill_value=0).astype({"count": "int64", "bytes": "float64"}),
            modules=self.modules.add(other.modules, fill_value=0).astype("int64"),
            ranks=self.ranks | other.ranks,
            max_dur_s=max(self.max_dur_s, other.max_dur_s),
        )

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


def _ranked(counts: pd.Series) -> pd.Series:
    """Counts, most first, ties by name: one order whatever order the calls were read in."""
    if counts.empty:
        return counts
    order = np.lexsort((counts.index.astype(str).to_numpy(), -counts.to_numpy()))
    return counts.iloc[order]
