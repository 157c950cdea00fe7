"""`Metrics`' figures of a diag trace read a window of steps at a time (issue 14, docs/scale.md):
each window's figures computed with `Metrics`' own code on the window's frames, only their
per-(rank, step), per-(rank, op, group) and per-(group, rank) reductions kept, so what is held
follows the steps, not the calls.

    acc = Windowed()
    for window in windows:            # every rank's records of steps lo..hi-1
        acc.add(window)               # (records with no step: in every window, read once)
    figures = acc.done(outside)       # the records of no step (-1 or none): calls before the first

Exact (equal to `Metrics(whole trace)`'s, same columns and dtypes), because every reader that
aligns calls across ranks does so within one (group, step) (`positions.place`):
- `steps`, `steady_steps`, `median_step_s`, `step_times`: from the step records, one a rank-step,
  kept whole; each rank's warm-up step is taken on them at the end.
- `exposed`, `blocked`: each (rank, step)'s union of its blocking calls, from its own calls.
  Carried across windows: a group's members (`positions.members`: a position's transfer time is
  known only where every member made the call); a (rank, step) whose group gains a member in a
  later window has a call of unknown transfer time there, as in the whole trace (NaN).
- `calls_per_step`, `comm_per_step`, `union_per_step` (no mask): per (rank, step) counts, sums
  and the union of its calls.
- `collectives`: per (rank, op, group, bus factor) sums added across windows: whole bytes and
  nanoseconds, exact in any order; the bus bytes are made from them at the end (`breakdown`).
- `stragglers`: per (group, rank) counts of positions seen and arrived last at, added across
  windows where the group's members were the same (a window of fewer members counts positions
  the whole trace does not: those are dropped when a member appears).
- `step_split`: each step's parts from the records that lie in its span (`split_windows`: a
  window's steps split once the next window has come, earlier windows' records carried).
- `breakdown`, `overlap`: a diag trace has no kernel or host-op timeline (Kineto's), so they are
  the empty frames; a window holding one is refused (its cut, the last step's start, and the
  unions of its intervals would span windows: read a Kineto trace whole).

Left out: `bandwidth_by_size` (an exact median of every call's busbw per (op, bytes): busbw
follows each call's duration, so the values do not repeat and no reduction keeps the median);
`comm_per_step(mask)` / `union_per_step(mask)` (a rule's own selection of calls: each would be a
fixed per-window column). A call outside every step that the whole trace attributes to a
step by its time (`comms.attribute_steps`: imported traces' step -1) is counted in `attributed`;
its step's figures then miss it (none does in a diag trace, whose calls carry their step), as
are records of no step that lie in a step split before they came (`split_windows.missed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diag import schema
from diag.metrics import breakdown, comms, positions, steps
from diag.metrics.split_windows import FOLD, SplitWindows, fold
from diag.metrics.text import as_text
from diag.trace import perfile
from diag.trace.model import Trace
from diag.trace.window import ALL, Window

_STEP_KINDS = (schema.STEP, "log_step", schema.MEMORY, schema.OVERFLOW)
# per (rank, step) records (a memory sample a step, an overflow a step at most): kept whole
WINDOW = 10  # steps a window (`read`): the lock-step reader's fixed cost is per window (docs/scale.md)
_TIMELINES = ("kernel", "cpu_op")  # Kineto's: `breakdown` and `overlap` read them whole


@dataclass
class Figures:
    """The figures `Windowed.done` gives, named and typed as `Metrics`' are."""

    steps: pd.DataFrame
    steady_steps: pd.DataFrame
    median_step_s: float
    step_times: pd.DataFrame
    exposed: pd.DataFrame
    blocked: pd.DataFrame
    collectives: pd.DataFrame
    stragglers: pd.DataFrame
    breakdown: pd.DataFrame
    overlap: pd.DataFrame
    step_split: pd.DataFrame
    attributed: int  # calls outside every step given one by time (see the module's docstring)
    per_step: dict[str, pd.Series] = field(repr=False)
    frames: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)  # `_STEP_KINDS`', whole
    members: dict[str, int] = field(default_factory=dict)  # group -> ranks with calls in it

    def calls_per_step(self, how: str = "size") -> pd.Series:
        """`Metrics.select()`'s `counts` (`size`) or `sums` (`sum`): per (rank, step), its calls'
        count or seconds."""
        return self.per_step[how]

    def comm_per_step(self) -> pd.DataFrame:
        """`Metrics.comm_per_step()`: seconds of communication per steady (rank, step)."""
        return steps.join_steps(self.steady_steps, self.per_step["sum"], "comm_s")

    def union_per_step(self) -> pd.DataFrame:
        """`Metrics.union_per_step()`: the union of its calls' intervals per steady (rank, step)."""
        return steps.join_steps(self.steady_steps, self.per_step["union"], "comm_s")


@dataclass
class _Blocking:
    """`comms.blocking_union`'s parts of each window, for `exposed` (transfer time) or `blocked`."""

    values: list[pd.Series] = field(default_factory=list)
    gone: list[pd.DataFrame] = field(default_factory=list)  # (rank, step)s of an unknown transfer
    any: bool = False  # a blocking call in some window

    def add(self, parts: tuple[pd.Series, pd.MultiIndex | None] | None) -> None:
        if parts is not None:
            self.any = True
            self.values.append(parts[0])
            fold(self.values, pd.concat)
            if parts[1] is not None:
                self.gone.append(parts[1].to_frame(index=False))
                fold(self.gone, lambda p: pd.concat(p, ignore_index=True))

    def frame(self, steady: pd.DataFrame, extra: list[pd.DataFrame]) -> pd.DataFrame:
        if not self.any:
            return comms.join_blocking(steady, None, None)
        values = [v for v in self.values if len(v)]
        joined = pd.concat(values) if values else pd.Series(dtype=float)
        self.values = [joined]  # (held once: the windows' parts freed)
        gone = [g for g in [*self.gone, *extra] if len(g)]
        lost = pd.MultiIndex.from_frame(pd.concat(gone, ignore_index=True)) if gone else None
        return comms.join_blocking(steady, joined, lost)


class Windowed:
    """Takes a trace's windows one at a time (`add`), then its records of no step (`done`)."""

    def __init__(self) -> None:
        self._step_parts: dict[str, list[pd.DataFrame]] = {k: [] for k in _STEP_KINDS}
        self._members: dict[str, set] = {}  # group -> ranks with calls in it (`Metrics.comms`')
        self._arrival_members: dict[str, set] = {}  # the same of the calls `stragglers` places
        self._ranks: set = set()  # ranks with calls (`stragglers`' rows)
        self._exposed, self._blocked = _Blocking(), _Blocking()
        self._known_transfer: list[tuple[str, int, pd.DataFrame]] = []  # (group, its members, (rank, step)s)
        self._per_step: dict[str, list[pd.Series]] = {"size": [], "sum": [], "union": []}
        self._sums: list[pd.DataFrame] = []  # the sums so far, FOLD windows' at most
        self._arrivals: dict[str, tuple[int, pd.DataFrame]] = {}  # group -> (members, counts per rank)
        self._headers: dict = {}
        self._split = SplitWindows()

    def add(self, trace: Trace) -> None:
        """One window: every rank's records of steps lo..hi-1 (and those of no step column)."""
        for kind in _TIMELINES:
            if len(trace.frame(kind)):
                raise ValueError(f"a window with {kind} records (Kineto): read that trace whole")
        self._headers = trace.headers
        for kind, parts in self._step_parts.items():
            parts.append(trace.frame(kind))
            fold(parts, _rejoin)
        spans = steps.step_frame(trace.steps)
        c = comms.comm_frame(trace.comms, spans)
        between = comms.between_ranks(trace.comms)
        self._calls(c, c, between)
        self._split.add(between, trace.frame(schema.LAYER), spans)

    def done(self, outside: Trace | None = None) -> Figures:
        """The figures, after every window and `outside`: the step-carrying records no window
        holds (no integer step, or -1). Once: the windows' parts are replaced by what they join to."""
        raw = {}
        for kind, parts in self._step_parts.items():  # (each kind's windows' frames, held once:
            # the joined frame replaces them, and the rejoins of every kind with their windows'
            # frames still held were the pass's peak at 256 ranks x 500 steps)
            parts[:] = [_rejoin(parts)]
            if outside is not None:
                parts[:] = [_rejoin([parts[0], outside.frame(kind)])]
            raw[kind] = parts[0]
        every = steps.step_frame(raw[schema.STEP])
        attributed, by_time = 0, False
        if outside is not None and len(outside.comms):
            c = comms.comm_frame(outside.comms, every)
            between = comms.between_ranks(outside.comms)
            by_time = not comms.stepped(between) and not every.empty  # `attribute_steps` ran
            attributed = int((pd.to_numeric(c["step"]) >= 0).sum()) if by_time else 0
            # the whole trace's calls then are not `stepped`: `stragglers` places them as written
            self._calls(c, between if by_time else c, between)
        per_step = {}
        for how, parts in self._per_step.items():
            parts[:] = [_by_step(parts, by_time)]
            per_step[how] = parts[0]
        none = outside or Trace()
        self._split.done(
            comms.between_ranks(none.comms), none.frame(schema.LAYER), steps.step_frame(none.steps), every
        )
        steady = steps.steady_steps(every)
        empty = Trace(headers=self._headers)  # no kernel or host-op timeline: no row
        return Figures(
            steps=every,
            steady_steps=steady,
            median_step_s=float(steady["dur_s"].median()) if not steady.empty else 0.0,
            step_times=breakdown.step_times(Trace(frames=raw), every),
            exposed=self._exposed.frame(steady, self._lost()),
            blocked=self._blocked.frame(steady, []),
            collectives=breakdown.stats_frame(breakdown.merge_sums(self._sums)),
            stragglers=breakdown.straggler_frame(sorted(self._ranks), self._shares, raw[schema.STEP]),
            step_split=self._split.frame(steady),
            breakdown=breakdown.temporal_breakdown(empty),
            overlap=breakdown.comm_overlap(empty),
            attributed=attributed + self._split.missed,
            per_step=per_step,
            frames=raw,
            members={g: len(r) for g, r in sorted(self._members.items())},
        )

    def kept(self) -> dict[str, int]:
        """Bytes held per reduction (`memory_usage(deep=True)`), for docs/scale.md's figures."""
        size = _bytes
        return {
            "steps": sum(size(p) for parts in self._step_parts.values() for p in parts),
            "exposed": sum(size(p) for p in [*self._exposed.values, *self._exposed.gone]),
            "blocked": sum(size(p) for p in [*self._blocked.values, *self._blocked.gone]),
            "known_transfer": sum(size(p) for _, _, p in self._known_transfer),
            "per_step": sum(size(p) for parts in self._per_step.values() for p in parts),
            "collectives": sum(size(p) for p in self._sums),
            "stragglers": sum(size(p) for _, p in self._arrivals.values()),
            "step_split": self._split.kept(),
            "split_carry": self._split.carried(),  # a window's records, not per rank-step
        }

    # ---- one window's calls ------------------------------------------------------------------
    def _calls(self, c: pd.DataFrame, placed: pd.DataFrame, between: pd.DataFrame) -> None:
        """Reduce one window's calls: `c` as `Metrics.comms`, `placed` the calls `stragglers`
        places (`c` itself but for `done`'s), `between` as `collective_stats` reads them."""
        sums = breakdown.collective_sums(between, at_once=True) if len(between) else None
        if sums is not None:  # folded every FOLD windows: rows per (rank, op, group), not per window
            self._sums.append(sums)
            fold(self._sums, breakdown.merge_sums)
        calls = c[["rank", "step", "dur_s"]].groupby(["rank", "step"], observed=True)["dur_s"]
        self._per_step["size"].append(calls.size())
        self._per_step["sum"].append(calls.sum())
        self._per_step["union"].append(steps.union_by_step(c[["rank", "step", "ts", "dur"]], at_once=True))
        for parts in self._per_step.values():
            fold(parts, pd.concat)
        at, window = None, None
        if len(c):
            window = _members(c)
            _unite(self._members, window)
            at = positions.place(c)
            xfer = comms.transfer_dur(c, at)
            self._exposed.add(comms.blocking_union(c, False, xfer, at_once=True))
            self._blocked.add(comms.blocking_union(c, True, at_once=True))
            self._hold_known(c, xfer, window)
        if len(placed):
            self._count_arrivals(placed, at if placed is c else None, window if placed is c else None)

    def _hold_known(self, c: pd.DataFrame, xfer: pd.Series, members: dict[str, set]) -> None:
        """Each group's (rank, step)s with a blocking call of known transfer time, with the
        window's members of the group: unknown after all if the group has more in the end."""
        known = comms.blocking(c) & xfer.notna().to_numpy() & c["dur"].notna().to_numpy()
        if not known.any():
            return
        rows = pd.DataFrame(
            {
                "group": as_text(c["group"])[known].astype(str),
                "rank": c["rank"][known],
                "step": c["step"][known],
            }
        ).drop_duplicates()
        for group, mine in rows.groupby("group", sort=False):
            pairs = mine[["rank", "step"]].reset_index(drop=True)
            self._known_transfer.append((str(group), len(members[str(group)]), pairs))
        if len(self._known_transfer) >= FOLD * 4:  # a group's pairs of the same members as one
            held: dict[tuple[str, int], list[pd.DataFrame]] = {}
            for group, had, pairs in self._known_transfer:
                held.setdefault((group, had), []).append(pairs)
            self._known_transfer = [(g, had, pd.concat(p, ignore_index=True)) for (g, had), p in held.items()]

    def _count_arrivals(
        self, placed: pd.DataFrame, at: positions.Positions | None, members: dict[str, set] | None
    ) -> None:
        """Per group, the positions' counts of last arrivals, kept while its members stay the
        same (more members later: those positions were not every member's). `at`, `members`:
        `placed`'s, where known."""
        self._ranks.update(placed["rank"].dropna().unique().tolist())
        _unite(self._arrival_members, _members(placed) if members is None else members)
        counts = breakdown.arrival_counts(placed, at)
        for group, mine in counts.groupby("group", sort=False):
            need = int(mine["need"].iloc[0])
            held = self._arrivals.get(str(group))
            part = mine[["rank", "lasts", "seen"]]
            if held is None or need > held[0]:
                self._arrivals[str(group)] = (need, part.reset_index(drop=True))
            elif need == held[0]:
                both = pd.concat([held[1], part]).groupby("rank", sort=True).sum().reset_index()
                self._arrivals[str(group)] = (need, both)

    def _lost(self) -> list[pd.DataFrame]:
        """(rank, step)s whose group had fewer members in their window than in the whole trace."""
        return [
            pairs for group, had, pairs in self._known_transfer if had < len(self._members.get(group, ()))
        ]

    def _shares(self) -> pd.Series:
        kept = [
            counts.assign(group=group, need=need)
            for group, (need, counts) in self._arrivals.items()
            if need == len(self._arrival_members.get(group, ()))
        ]
        cols = breakdown.ARRIVAL_COLUMNS
        return breakdown.arrival_shares(pd.concat(kept)[cols] if kept else pd.DataFrame(columns=cols))


def read(path: str, size: int = WINDOW, window: Window = ALL, ahead: int | None = None) -> Figures:
    """The figures of the diag trace at `path`, its rank files read forward together `size` steps
    at a time (`trace.lockstep`): what is held follows the window, not the job. A file whose records
    come out of step order (`OutOfStep`: a record of a window already given) is read whole instead,
    and its figures made the same way from its windows (`split`). `ahead`: the reader's look-ahead
    in records a file (None: `lockstep.ahead_for` the files)."""
    from diag.trace.lockstep import LockStep, OutOfStep
    from diag.trace.reader import load_trace

    acc, reading = Windowed(), LockStep(path, size, window, **({} if ahead is None else {"ahead": ahead}))
    try:
        for part in reading:
            acc.add(part.trace)
    except OutOfStep:
        acc = Windowed()
        windows, outside = split(load_trace(path, window=window), size)
        for w in windows:
            acc.add(w)
        return acc.done(outside)
    return acc.done(reading.outside)


def split(trace: Trace, size: int) -> tuple[list[Trace], Trace]:
    """(the windows of `size` steps, the outside trace) of a trace read whole, as the lock-step
    reader gives them: window k is the records of steps lo..lo+W-1 (`Window.frames`; records of no
    step column in every window), `outside` the step-carrying records no window holds."""
    stepped = [pd.to_numeric(df["step"], errors="coerce") for df in trace.frames.values() if "step" in df]
    known = pd.concat(stepped) if stepped else pd.Series(dtype=float)
    known = known[known >= 0]
    lo, hi = (int(known.min()), int(known.max()) + 1) if len(known) else (0, 0)
    windows = [
        Trace(headers=trace.headers, frames=Window(None, a, a + size).frames(trace.frames))
        for a in range(lo, hi, size)
    ]
    outside = {}
    for kind, df in trace.frames.items():
        if "step" in df:
            step = pd.to_numeric(df["step"], errors="coerce")
            outside[kind] = df[~((step >= lo) & (step < hi)).to_numpy()].reset_index(drop=True)
    return windows, Trace(headers=trace.headers, frames=outside)


def _members(c: pd.DataFrame) -> dict[str, set]:
    """group -> the ranks with calls in it (`positions.members`' count, by the groups' names)."""
    pairs = pd.DataFrame({"group": as_text(c["group"]), "rank": c["rank"]}).dropna().drop_duplicates()
    return {
        str(g): set(mine["rank"].tolist()) for g, mine in pairs.groupby("group", sort=False, observed=True)
    }


def _unite(into: dict[str, set], more: dict[str, set]) -> None:
    for group, ranks in more.items():
        into.setdefault(group, set()).update(ranks)


def _rejoin(parts: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Windows' rows of one kind as the reader orders the whole kind: by rank, then time."""
    parts = list(parts)
    rows = [p for p in parts if len(p)]
    if len(rows) <= 1:
        return (rows or parts)[0].reset_index(drop=True) if parts else pd.DataFrame()
    try:  # the dtypes one frame of every window's records has (a window of steps whose records
        # all lack a duration holds None: NaN among the others' numbers, as the whole read's)
        df = perfile.join([p.copy(deep=False) for p in rows])  # (`join` takes its parts' columns)
    except perfile.Uneven:
        df = pd.concat(rows, ignore_index=True)
    keys = [k for k in ("rank", "ts") if k in df.columns]
    return df.sort_values(keys, kind="stable").reset_index(drop=True) if keys else df


def _by_step(parts: list[pd.Series], by_time: bool) -> pd.Series:
    """Per (rank, step) figures of the windows as one (a step is in one window: no sum regroups);
    the steps as floats where the whole trace's were attributed by time (`attribute_steps`)."""
    rows = [p for p in parts if len(p)]
    if not rows:
        return parts[0] if parts else pd.Series(dtype=float)
    out = pd.concat(rows).groupby(level=["rank", "step"], sort=True).sum()
    if by_time:
        out.index = out.index.set_levels(out.index.levels[1].astype(float), level="step")
    return out


def _bytes(obj: pd.DataFrame | pd.Series) -> int:
    usage = obj.memory_usage(deep=True, index=True)
    return int(np.sum(usage))
