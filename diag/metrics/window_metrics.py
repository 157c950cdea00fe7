"""A `Metrics` of one window of steps that computes what the whole trace's would: the window's
records, the whole trace's steps and groups' members (issue 14, docs/scale.md).

Why the whole trace's: each rank's warm-up step is its first of the job, not of the window
(`steps.steady`), and a position of a group's calls is full only where every member of the whole
trace made its call (`positions.known_members`): a window in which a member made no call in a
group would count its positions full and give transfer times the whole trace does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import pandas as pd

from diag.metrics import positions, steps
from diag.metrics.reduction import Reduction
from diag.metrics.stage import Metrics
from diag.metrics.text import as_text
from diag.trace.model import Trace

T = TypeVar("T")


@dataclass(frozen=True)
class Whole:
    """What a window's figures take from the whole trace: its steps (`Metrics.steps`, every rank's
    every step) and each group's members (ranks with calls in it, by the group's name)."""

    steps: pd.DataFrame
    members: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, metrics: Metrics) -> Whole:
        """The whole trace's, from its `Metrics` (tests; the windowed pass gathers them as it reads)."""
        return cls(metrics.steps, member_counts(metrics.comms))

    @cached_property
    def steady_steps(self) -> pd.DataFrame:
        """`steps.steady_steps(steps)`, once for every window (a groupby over every rank-step: made a
        window, it was a copy of the job's steps and ~0.1 s each at 512,000 rank-steps)."""
        return steps.steady_steps(self.steps)


def member_counts(c: pd.DataFrame) -> dict[str, int]:
    """group -> how many ranks made calls in it (`positions.members`, by the groups' names)."""
    if c.empty:
        return {}
    pairs = pd.DataFrame({"group": as_text(c["group"]), "rank": c["rank"]}).dropna().drop_duplicates()
    return {str(g): int(n) for g, n in pairs.groupby("group", sort=True, observed=True).size().items()}


def of_window(trace: Trace, whole: Whole) -> Metrics:
    """`trace` (one window's records, as `LockStep` gives them) with the whole trace's steps."""
    m = Metrics(trace)
    m.__dict__["steps"] = whole.steps  # (cached properties: what `Metrics` would compute, given)
    m.__dict__["steady_steps"] = whole.steady_steps
    return m


def part(r: Reduction[T], window: Metrics, whole: Whole) -> T:
    """`r`'s part of one window (`of_window`), its placements counting the whole trace's members."""
    with positions.known_members(whole.members):
        try:
            return r.of(window)
        finally:
            window.end_rule()


def merged(r: Reduction[T], windows: list[Trace], whole: Whole) -> T:
    """`r` of a trace's windows, each reduced then merged in step order (tests; `windowed_stage`
    reduces each window as it is read and merges at the end)."""
    return r.merged(parts(r, windows, whole))


def parts(r: Reduction[T], windows: list[Trace], whole: Whole) -> list[T]:
    """`r`'s part of each of a trace's windows, in step order."""
    return [part(r, of_window(w, whole), whole) for w in windows]
