"""A figure a rule or the report reads of the records kept per call or per layer, in the form the
windowed pass computes a window of steps at a time (issue 14, docs/scale.md).

Why: a 1,024-rank x 10,000-step job's calls do not fit in memory, so nothing may read them whole.
A reader says what it reads of them as a `Reduction`:

- `of(metrics)`: the figure from one `Metrics`: the whole trace's, or one window's (its trace holds
  that window's records; its `steps` / `steady_steps` are the whole trace's and its groups' members
  the whole trace's, `window_metrics.of_window`, so a call's transfer time and a step's warm-up
  are what the whole trace says);
- `merged(parts)`: the parts of consecutive windows, in step order, as the whole trace's figure.
  `merged([part])` is `part`'s figure: `Metrics.reduce` takes that path on the whole trace too, so
  the whole run and the windowed one share the code that shapes what the rule reads.

A reduction is hashable by value (a frozen dataclass; a pick a module-level function): the
windowed pass runs the rules once to learn which reductions they ask for, computes those in one
pass over the windows, and runs the rules again (`windowed_stage`). Test: `tests/unit/windowing.py`
(`assert_windowed`: windows of 1, 3 and all steps merged, against the whole).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pandas as pd

from diag.metrics.lasts import Tails
from diag.metrics.selection import PerStep, Pick, Selected

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

T = TypeVar("T")
Early = Callable[["Trace"], "Reduction[Any] | None"]
_EARLY: list[Early] = []


def early(make: Early) -> Early:
    """Register a reduction the windowed pass computes in its first pass, with the figures: one whose
    `of` reads only the window's own records (no whole-trace steps or members), that a rule asks
    for before it knows what else to ask (how many calls, which roles the groups play). Without
    it the rule's next question waits for a pass of its own. `make(trace)` builds it from a
    window's trace (its records of no step are the whole trace's); None: not wanted."""
    _EARLY.append(make)
    return make


def early_for(trace: Trace) -> list[Reduction[Any]]:
    """The early reductions (`early`) for a trace whose records of no step are `trace`'s."""
    made = (make(trace) for make in _EARLY)
    return list(dict.fromkeys(r for r in made if r is not None))


class Reduction(Hashable, Protocol[T]):
    """What a reader reads of the per-call or per-layer records (see the module's docstring)."""

    def of(self, metrics: Metrics) -> T: ...

    def merged(self, parts: list[T]) -> T: ...


@dataclass(frozen=True)
class Select:
    """`Metrics.select(pick)`: the calls `pick` selects, reduced (`selection.Selected`)."""

    pick: Pick | None = None

    def of(self, metrics: Metrics) -> Selected:
        c = metrics.comms
        if self.pick is None or c.empty:
            return Selected.of(c)
        return Selected.of(c, self.pick(c).reindex(c.index, fill_value=False).to_numpy(dtype=bool))

    def merged(self, parts: list[Selected]) -> Selected:
        return parts[0] if len(parts) == 1 else Selected.merged(parts)

    folds = True  # (its merged value is a part: counts and bytes added, ranks united, per window none)


@dataclass(frozen=True)
class OfSteps:
    """`Metrics.per_step(reduce)`: a figure per (rank, step) of that step's calls alone; windows'
    (rank, step)s are apart, so their figures concatenate."""

    reduce: PerStep

    def of(self, metrics: Metrics) -> pd.Series:
        return self.reduce(metrics.comms)

    def merged(self, parts: list[pd.Series]) -> pd.Series:
        if len(parts) == 1:
            return parts[0]
        rows = [p for p in parts if len(p)]
        if not rows:
            return parts[0] if parts else pd.Series(dtype=float)
        return pd.concat(rows).sort_index(kind="stable")


@dataclass(frozen=True)
class Calls:
    """`Metrics.calls`: how many collectives `comms` holds."""

    def of(self, metrics: Metrics) -> int:
        return len(metrics.comms)

    def merged(self, parts: list[int]) -> int:
        return sum(parts)

    folds = True  # (its merged value is a part: a count)


@dataclass(frozen=True)
class Lasts:
    """`Metrics.lasts`: each rank's last records and calls (`lasts.Tails`)."""

    def of(self, metrics: Metrics) -> Tails:
        from diag import schema
        from diag.metrics import comms

        o = metrics.trace.frame(schema.COMM_OPEN)
        opened = comms.comm_frame(o.assign(dur=None), metrics.steps) if not o.empty else None
        return Tails.of(metrics.comms, opened, metrics.trace.frames)

    def merged(self, parts: list[Tails]) -> Tails:
        return Tails.merged(parts)

    folds = True  # (its merged value is a part: a rank's lasts stay a rank's, not a window's)


@dataclass(frozen=True)
class Groups:
    """`Metrics.groups`: each process group the calls name (members, size), every call's (lone ones
    too): a set the windows unite."""

    def of(self, metrics: Metrics) -> frozenset[tuple[tuple[int, ...], int]]:
        c = metrics.trace.comms
        if c.empty or "group_ranks" not in c:
            return frozenset()
        return frozenset(
            (tuple(int(r) for r in ranks), size)
            for ranks, size in zip(c["group_ranks"], c["group_size"])
            if isinstance(ranks, list)
        )

    def merged(self, parts: list[frozenset]) -> frozenset:
        return frozenset().union(*parts)

    folds = True  # (its merged value is a part: a set)


early(lambda _trace: Calls())
early(lambda _trace: Groups())
