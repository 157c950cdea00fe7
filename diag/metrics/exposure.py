"""Exposed seconds of a subset of the calls (those a pick keeps), per (rank, step), in the form the
windowed pass computes a window of steps at a time (`diag.metrics.reduction`).

Why apart from `Metrics.exposed`: a rule that weighs one kind of communication against another
(exposed_comm: tensor-parallel calls apart from those an overlap setting hides) places the subset
on its own (`comms.transfer_dur` of those calls), as `comms.blocking_per_step` of the subset did.
A (rank, step)'s union is of its own calls, all in its window, so the windows' unions concatenate;
they are joined to the whole trace's steady steps after the merge (`per_step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from diag.metrics import comms
from diag.metrics.selection import Pick

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics

Blocked = tuple[pd.Series, pd.MultiIndex | None] | None  # `comms.blocking_union`'s figure


@dataclass(frozen=True)
class Exposed:
    """The blocking transfer union per (rank, step) of the calls `pick` keeps, and the (rank, step)s
    with a blocking call whose transfer time is unknown (`comms.blocking_union`; None: the calls
    kept hold no blocking one)."""

    pick: Pick

    def of(self, metrics: Metrics) -> Blocked:
        c = metrics.comms
        if c.empty:
            return None
        keep = self.pick(c).reindex(c.index, fill_value=False).to_numpy(dtype=bool)
        return comms.blocking_union(c[keep], waits=False) if keep.any() else None

    def merged(self, parts: list[Blocked]) -> Blocked:
        held = [p for p in parts if p is not None]
        if len(held) < 2:
            return held[0] if held else None
        values = [v for v, _ in held if len(v)]
        gone = [g for _, g in held if g is not None and len(g)]
        union = pd.concat(values).sort_index(kind="stable") if values else held[0][0]
        if not gone:
            return union, None
        return union, (gone[0].append(gone[1:]) if len(gone) > 1 else gone[0]).unique()

    def per_step(self, metrics: Metrics) -> pd.DataFrame:
        """Joined to the steady steps: rank, step, dur_s, exposed_s (NaN where a transfer is
        unknown; an empty frame where no call kept blocks), as `comms.blocking_per_step` gives."""
        return comms.join_blocking(metrics.steady_steps, *(metrics.reduce(self) or (None, None)))
