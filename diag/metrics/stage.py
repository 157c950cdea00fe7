"""The analysis stage: every figure of one trace, computed at most once, typed, read by the rules
and the report alike.

    Trace -> Metrics -> Findings (diag.analyzers) -> report document (diag.report.model) -> renderers

Each figure is computed on first use and kept (`functools.cached_property`): the TUI's periodic
analysis pays only for what its rules read, `diag analyze` for the report's tables once more. Frames
are shared between readers: treat them as read-only (derive with `assign` / selections).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd

from diag import schema
from diag.metrics import breakdown, comms, positions, reduction, step_split, steps
from diag.metrics.lasts import Tails
from diag.metrics.selection import PerStep, Pick, Selected

if TYPE_CHECKING:
    from diag.trace.model import Trace

T = TypeVar("T")
_NONE: Any = object()


@dataclass(eq=False)
class Metrics:
    """The figures of one trace. Definitions: docs/analyze.md and each function's docstring."""

    trace: Trace
    _placement: positions.Positions | None = field(default=None, init=False, repr=False)
    _transfer: pd.Series | None = field(default=None, init=False, repr=False)
    _reduced: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)
    _for_rule: dict[Any, Any] | None = field(default=None, init=False, repr=False)

    # ---- whole-trace figures (the report's metrics section) -----------------------------------
    @cached_property
    def breakdown(self) -> pd.DataFrame:
        """Per rank: idle / compute / non-compute time and shares (`breakdown.temporal_breakdown`)."""
        return breakdown.temporal_breakdown(self.trace)

    @cached_property
    def overlap(self) -> pd.DataFrame:
        """Per rank: communication time hidden under compute (`breakdown.comm_overlap`)."""
        return breakdown.comm_overlap(self.trace)

    @cached_property
    def collectives(self) -> pd.DataFrame:
        """Per rank and op: calls, time, bytes, algbw, busbw (`breakdown.collective_stats`)."""
        return breakdown.collective_stats(self.trace)

    @cached_property
    def bandwidth_by_size(self) -> pd.DataFrame:
        """Median busbw per op and message size (`breakdown.bandwidth_by_size`)."""
        return breakdown.bandwidth_by_size(self.trace)

    @cached_property
    def stragglers(self) -> pd.DataFrame:
        """Per rank: share of collectives it arrived last at, median step (`breakdown.stragglers`)."""
        if self.steps.empty or comms.stepped(self.trace.comms):  # `comms` holds the trace's calls as they are
            return breakdown.stragglers(self.trace, self.comms, self.placement)
        return breakdown.stragglers(self.trace)

    @cached_property
    def step_split(self) -> pd.DataFrame:
        """Per rank, over steady (sampled) steps of a diag trace: compute / exposed communication /
        other time (`step_split.step_split`)."""
        marks = self.trace.frame(schema.STEP)
        # the GPU split's span ends where the last profiled step begins (HTA's cut, `activity`)
        per_rank = marks["rank"].value_counts().items() if len(marks) else []
        counts = {int(r): max(n - 1, 1) for r, n in per_rank}
        return step_split.step_split(
            self.steady_steps,
            comms.between_ranks(self.trace.comms),
            self.trace.layers,
            self.breakdown,
            self.overlap,
            counts,
        )

    @cached_property
    def step_times(self) -> pd.DataFrame:
        """rank, step, dur_ns from step events or the log (`breakdown.step_times`)."""
        return breakdown.step_times(self.trace, self.steps)

    # ---- per-step tables (what the rules compare against the step) ---------------------------
    @cached_property
    def steps(self) -> pd.DataFrame:
        """One row per (rank, step) with a duration: dur_s, start, end (`steps.step_frame`)."""
        return steps.step_frame(self.trace.steps)

    @cached_property
    def steady_steps(self) -> pd.DataFrame:
        """`steps` without each rank's warm-up step (`steps.STEADY_COLUMNS` of it)."""
        return steps.steady_steps(self.steps)

    @cached_property
    def median_step_s(self) -> float:
        st = self.steady_steps
        return float(st["dur_s"].median()) if not st.empty else 0.0

    @cached_property
    def comms(self) -> pd.DataFrame:
        """Collectives with canonical `kind`, `dur_s` and a step each (`comms.comm_frame`)."""
        return comms.comm_frame(self.trace.comms, self.steps)

    @property
    def placement(self) -> positions.Positions:
        """Each of `comms`' calls placed among its group's calls across ranks (`positions.place`),
        once per rule: the straggler rule alone read `transfer_dur`, `arrival_wait` and
        `stragglers`, each placing every call anew (50-60 bytes a call at its peak). Held until
        the rule ends (`end_rule`), not under every later one: 8 bytes a call kept raised each
        later stage, and a 64-rank x 1,000-step trace's peak (+31 MiB)."""
        if self._placement is None:
            self._placement = positions.place(self.comms)
        return self._placement

    @property
    def placed(self) -> positions.Positions | None:
        """`placement` where this rule placed the calls already, else None."""
        return self._placement

    @property
    def transfer(self) -> pd.Series:
        """Each of `comms`' calls' transfer time (`comms.transfer_dur` on `placement`), once per
        rule and held as `placement` is: the straggler rule read it twice (`exposed` and its async
        tail, `straggler.async_tail_wait`), each a reduction over every call."""
        if self._transfer is None:
            self._transfer = comms.transfer_dur(self.comms, self.placement)
        return self._transfer

    def for_rule(self, make: Callable[[Metrics], T]) -> T:
        """`make(self)`, once per rule: a figure two parts of one rule read, held until the rule ends
        (`end_rule`) as `placement` is, not under the later rules and the report (the straggler
        rule's per-step table, ~56 bytes a rank-step, was held to the report's end: the last stage
        of a windowed analysis at 256 ranks x 2,000 steps). A dict of this stage's own: a copy
        (`windowed_stage.settle`'s runs) makes its own on its first use."""
        if self._for_rule is None:
            self._for_rule = {}
        if make not in self._for_rule:
            self._for_rule[make] = make(self)
        return self._for_rule[make]

    def end_rule(self) -> None:
        """Drop what is held for one rule only (`placement`, `transfer`, `for_rule`'s;
        `analyzers.run_all` after each)."""
        self._placement = None
        self._transfer = None
        self._for_rule = None

    @cached_property
    def exposed(self) -> pd.DataFrame:
        """Per steady (rank, step): seconds blocked in collectives, transfer time only (`exposed_s`)."""
        return comms.blocking_per_step(self.comms, self.steady_steps, waits=False, xfer=self.transfer)

    @cached_property
    def blocked(self) -> pd.DataFrame:
        """Like `exposed`, with the time spent waiting for late ranks (what a rank's step loses)."""
        return comms.blocking_per_step(self.comms, self.steady_steps, waits=True)

    @property
    def groups(self) -> frozenset[tuple[tuple[int, ...], int]]:
        """Each process group the calls name: (its recorded members, its size), of every call the
        trace holds (lone ones too). A set: the windowed pass unites each window's."""
        return self.reduce(reduction.Groups())

    @property
    def lasts(self) -> Tails:
        """Each rank's last records and calls, reduced (`lasts.Tails`): what the hang and crash
        rules read, with the `comm_open` rows (calls entered, not completed) read as calls."""
        return self.reduce(reduction.Lasts())

    def reduce(self, r: reduction.Reduction[T]) -> T:
        """`r`'s figure of this trace (`reduction`), computed once: what a rule reads of the calls or
        layers, in the form the windowed pass computes a window at a time and merges."""
        held = self._reduced.get(r, _NONE)
        if held is _NONE:
            held = self._reduced[r] = r.merged([r.of(self)])
        return held

    @property
    def calls(self) -> int:
        """How many collectives `comms` holds (what a rule asks before it selects any)."""
        return self.reduce(reduction.Calls())

    def comm_per_step(self, pick: Pick | None = None) -> pd.DataFrame:
        """Seconds of (selected) communication per steady (rank, step), summed: rank, step, dur_s,
        comm_s."""
        return steps.join_steps(self.steady_steps, self.select(pick).sums, "comm_s")

    def select(self, pick: Pick | None = None) -> Selected:
        """The calls `pick` selects (all), reduced to what a rule reads of them (`Selected`: per
        (rank, step) counts and seconds, per op and module counts, the sizes' counts). `pick` reads
        each call's own columns only (a mask of `comms`' rows), so the windowed pass can apply it a
        window of steps at a time and merge what it reduces (docs/scale.md). Hashable by value."""
        return self.reduce(reduction.Select(pick))

    def per_step(self, reduce: PerStep) -> pd.Series:
        """`reduce` of `comms`: a figure indexed by (rank, step) whose value for a (rank, step)
        depends on that step's calls alone (every rank's: a step's calls are placed within it), so
        the windowed pass can compute it a window of steps at a time and concatenate (docs/scale.md)."""
        return self.reduce(reduction.OfSteps(reduce))

    def union_per_step(self, mask: pd.Series | None = None) -> pd.DataFrame:
        """Like `comm_per_step`, but `comm_s` is the union of the ops' intervals, not their sum."""
        c = self._selected(mask, ["rank", "step", "ts", "dur"])
        return steps.join_steps(self.steady_steps, steps.union_by_step(c), "comm_s")

    def _selected(self, mask: pd.Series | None, columns: list[str]) -> pd.DataFrame:
        """The selected calls' `columns` (only they are copied: a mask over every call of a
        16-rank x 1,000-step trace copied 76 MiB of columns nothing read)."""
        c = self.comms[columns]
        return c if mask is None else c[mask.reindex(c.index, fill_value=False)]
