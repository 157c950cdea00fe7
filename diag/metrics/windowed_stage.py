"""`diag analyze` of a diag trace read a window of steps at a time (issue 14, docs/scale.md): the
analysis stage (`Metrics`) of a job whose calls and layer records do not fit in memory.

    stage = windowed_stage.read(path, window, size=10)       # pass 1: the figures
    findings, failures, doc = stage.settle(lambda: ...)      # the rules, the report; more passes

Pass 1 (`windowed.Windowed`) reduces every window to `Metrics`' figures (steps, exposed, blocked,
collectives, stragglers, step split), each group's members and each rank's latest records, and
keeps whole the frames of a record or fewer a rank-step (steps, memory, overflows) and those of no
step. The per-call and per-layer frames are never held: a rule reads them through reductions
(`diag.metrics.reduction`). The rules and the report run once to learn which reductions they ask
for (`reduce` answers each with its empty value meanwhile), one pass over the windows computes
those, and they run again: until they ask for none they lack (a reduction whose pick depends on
another's value takes one pass more). A reader of the withheld frames outside a reduction raises
`WholeOnly`: that rule is reported not run, never run on a part of its input.
"""

from __future__ import annotations

import copy
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, TypeVar

import pandas as pd

from diag import schema
from diag.metrics import lasts, positions, reduction, size_medians, spill
from diag.metrics.reduction import Reduction
from diag.metrics.split_windows import FOLD
from diag.metrics.stage import Metrics
from diag.metrics.window_metrics import Whole, of_window
from diag.metrics.windowed import WINDOW, Figures, Windowed
from diag.metrics.withheld import WITHHELD, WholeOnly
from diag.trace import safeio, step_align
from diag.trace.heap import release_memory
from diag.trace.model import Trace
from diag.trace.reader import RANK_GLOB, matching
from diag.trace.window import ALL, Window

T = TypeVar("T")
RANK_STEPS = 256  # a window's rank-steps of the ZeRO-3 sample (`steps_for`): ~150 KB each held
ZERO3_RECORDS = 71  # the ZeRO-3 sample's records a rank-step (`RANK_STEPS`' calibration)
WINDOW_RECORDS = RANK_STEPS * ZERO3_RECORDS  # a window's records (~2 KB each held while it is read)
SAMPLE_BYTES = 1 << 20  # of the first rank file, read for its records a rank-step (`steps_for`)
PASSES = 4  # reduction passes at most after the first (two are enough for every rule today)
# `Metrics`' figures pass 1 gives (its cached properties `Figures` names)
_FIGURES = tuple(f.name for f in fields(Figures) if isinstance(vars(Metrics).get(f.name), cached_property))


class NotWindowed(Exception):
    """A trace the windowed pass cannot read exactly (records out of step order, calls or layer
    records of no step, a Kineto timeline): read whole instead."""


class _Held(dict):
    """A trace's frames without the withheld kinds: asking for one raises `WholeOnly` (a reader that
    iterates the frames sees the others; `lasts.latest` is given the windows' `latest`)."""

    def __init__(self, frames: dict[str, pd.DataFrame], latest: dict[str, pd.Series]) -> None:
        super().__init__(frames)
        self.latest = latest

    def __getitem__(self, kind: str) -> pd.DataFrame:
        if kind in WITHHELD:
            raise WholeOnly(kind)
        return super().__getitem__(kind)

    def get(self, kind: str, default: Any = None) -> Any:
        if kind in WITHHELD:
            raise WholeOnly(kind)
        return super().get(kind, default)

    def __contains__(self, kind: object) -> bool:
        if kind in WITHHELD:
            raise WholeOnly(str(kind))
        return super().__contains__(kind)


@dataclass(eq=False, repr=False)
class HeldTrace(Trace):
    """The trace the rules and the report read under the windowed pass (`_Held` frames)."""

    def frame(self, kind: str) -> pd.DataFrame:
        if kind in WITHHELD:
            raise WholeOnly(kind)
        return super().frame(kind)

    def bare(self) -> Trace:
        """The held records as a trace of no call or layer record (a report section the pass does
        not reduce yet is made on it, and named partial: `report.model`)."""
        return Trace(self.headers, dict(self.frames), self.problems, self.sources)


@dataclass(eq=False)
class WindowedMetrics(Metrics):
    """`Metrics` whose figures pass 1 computed and whose reductions the later passes do."""

    path: str = ""
    window: Window = ALL
    size: int = WINDOW
    figures: Figures | None = field(default=None, repr=False)
    whole: Whole | None = field(default=None, repr=False)
    passes: int = 1  # over the rank files, the figures' included
    asked: set = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        for name in _FIGURES:
            self.__dict__[name] = getattr(self.figures, name)

    @property  # type: ignore[override]
    def comms(self) -> pd.DataFrame:
        raise WholeOnly(schema.COMM)

    @property
    def bandwidth_by_size(self) -> pd.DataFrame:  # type: ignore[override]
        """The median busbw per (op, size) from two reductions (`size_medians`)."""
        return size_medians.of_windows(self)

    def reduce(self, r: Reduction[T]) -> T:
        """The reduction's merged value once a pass computed it; before, its empty value (the rule's
        result is not kept: `settle` runs it again)."""
        if r in self._reduced:
            return self._reduced[r]
        self.asked.add(r)
        return r.merged([])

    def settle(self, run: Callable[[Metrics], T]) -> T:
        """`run(metrics)` (the rules, the report) until it asks for no reduction not computed, a pass
        over the windows for those it asked for between runs. Each run is given a copy of this
        stage of its own identity (its figures and the reductions computed so far): what a rule
        keeps per `Metrics` (`straggler`'s per-step table, weakly keyed) was made of a run's empty
        answers and must not outlive it."""
        for _ in range(PASSES + 1):
            m = copy.copy(self)
            m.asked = set()
            out = run(m)
            if not m.asked:
                return out
            asked = list(m.asked)
            del out, m  # the learning run's document and caches: not held through the next pass
            release_memory()
            if self.passes > PASSES:
                break
            self._compute(asked)
        raise NotWindowed(f"the rules asked for reductions after {self.passes} passes")

    def _compute(self, asked: list[Reduction[Any]]) -> None:
        from diag.trace.lockstep import LockStep, OutOfStep

        parts: dict[Any, list[Any]] = {r: [] for r in asked}
        whole = self.whole or Whole(self.steps)
        # what the pass never reads (the step records' frames, the per-step call figures) on disk
        held = [self.trace.frames, *((self.figures.frames, self.figures.per_step) if self.figures else ())]
        try:
            with spill.spilled(held, keep=[whole.steps, whole.steady_steps]):
                for part in LockStep(self.path, self.size, self.window):
                    with positions.known_members(whole.members):
                        _reduce(of_window(part.trace, whole), parts)
                for r in asked:  # (each one's parts freed as it is merged, before the frames return)
                    self._reduced[r] = r.merged(parts.pop(r))
        except OutOfStep as e:  # (pass 1 read them in step order: the files changed since)
            raise NotWindowed(str(e)) from None
        self.passes += 1


def read(path: str, window: Window = ALL, size: int | None = None) -> WindowedMetrics:
    """Pass 1 over the diag trace at `path`, `size` steps a window (default `steps_for`): the
    figures, the held frames, what the later passes take from the whole trace. Raises
    `NotWindowed` for a trace to read whole."""
    from diag.trace.lockstep import LockStep, OutOfStep

    size = size or steps_for(sorted(_rank_files(path)))
    acc, reading, latest = Windowed(), LockStep(path, size, window), []
    early: dict[Any, list[Any]] = {}
    try:
        for part in reading:
            acc.add(part.trace)
            latest.append(lasts.latest_of(part.trace.frames))
            if len(latest) >= FOLD:
                latest[:] = [lasts.merge_latest(latest)]
            _early(part.trace, early)
    except (OutOfStep, ValueError) as e:  # (ValueError: a window holding a Kineto timeline)
        raise NotWindowed(str(e)) from None
    outside = reading.outside or Trace(sources=[path])
    loose = [k for k in WITHHELD if not outside.frame(k).empty]
    if loose:
        raise NotWindowed(f"{', '.join(loose)} records outside every step")
    figures = acc.done(outside)
    if step_align.attached(outside) and step_align.shifts_of(
        outside.headers, figures.frames.get(schema.STEP)
    ):
        # (windows are cut by step number: ranks that need renumbering are aligned on the whole)
        raise NotWindowed("its ranks counted their steps from each one's attach, not alike (aligned whole)")
    latest.append(lasts.latest_of(outside.frames))
    frames = {k: df for k, df in outside.frames.items() if "step" not in df and k not in WITHHELD}
    frames.update({k: df for k, df in figures.frames.items() if len(df) or k in outside.frames})
    trace = HeldTrace(
        dict(outside.headers), _Held(frames, lasts.merge_latest(latest)), list(outside.problems), [path]
    )
    whole = Whole(figures.steps, figures.members)
    whole.__dict__["steady_steps"] = figures.steady_steps  # (its cached property: the same frame, held once)
    stage = WindowedMetrics(trace, path=path, window=window, size=size, figures=figures, whole=whole)
    stage._reduced.update({r: r.merged(parts) for r, parts in early.items()})
    return stage


def _early(window: Trace, held: dict[Any, list[Any]]) -> None:
    """The early reductions' parts of one window (`reduction.early`: they read its records alone)."""
    if not held:
        held.update({r: [] for r in reduction.early_for(window)})
    _reduce(Metrics(window), held)


def _reduce(m: Metrics, held: dict[Any, list[Any]]) -> None:
    """Each reduction's part of one window's `m`, added to its parts (`add`)."""
    for r, parts in held.items():
        add(r, parts, r.of(m))
        m.end_rule()  # (a rule's placement, held for its reduction only)


def add(r: Reduction[T], parts: list[T], part: T, fold: int | None = None) -> None:
    """`part` (the next window's) added to `r`'s `parts`; those of a reduction whose merged value is
    a part (`folds`: sums, counts, unions, whose merged value is smaller than its parts) joined
    once `fold` (FOLD) windows' are held. A left fold: each join takes the joined value first and
    the windows after it in order, so a merge that reads its parts in order (a float sum, the
    first found) gives the same value folded (`windowing.assert_windowed` checks every reduction that
    folds). A concatenation (`OfSteps`, `Idle`, `StepFlops`) does not fold: its merged value is
    as large as its parts, so a join would free nothing and copy its rows again each time."""
    parts.append(part)
    if getattr(r, "folds", False) and len(parts) >= (fold or FOLD):
        parts[:] = [r.merged(parts)]


def steps_for(files: list[str]) -> int:
    """Steps a window: about `WINDOW_RECORDS` records of every rank file's, the records a rank-step
    counted in the first `SAMPLE_BYTES` of the first file (`ZERO3_RECORDS` where those hold no step
    record). Each window costs a fixed ~0.1 s (its frames, pass 1's and pass 2's reductions) and
    holds ~2 KB a record: a window of 256 rank-steps (the rule before) of a DDP job writing 3
    records a rank-step made a 4-rank x 22,400-step trace of 47 MiB 5x slower to read than whole."""
    per = _records_per_rank_step(files[0]) if files else None
    return max(1, WINDOW_RECORDS // max(1, len(files) * (per or ZERO3_RECORDS)))


def _records_per_rank_step(path: str) -> int | None:
    """The writer's stepped lines per step record in the file's first `SAMPLE_BYTES` (rounded up);
    None where they hold no step record or the file cannot be read (the reader reports why)."""
    from diag.trace.stepfile import STEPPED_PREFIXES, line_prefix

    try:
        head = safeio.read_head(path, SAMPLE_BYTES)  # (a FIFO is refused, not waited on; gunzipped)
    except (safeio.InputError, OSError):
        return None
    lines = head.split(b"\n")[:-1]  # (the last one may be cut)
    step = line_prefix(schema.STEP)
    steps = sum(line.startswith(step) for line in lines)
    stepped = sum(line.startswith(STEPPED_PREFIXES) for line in lines)
    return -(-stepped // steps) if steps else None


def _rank_files(path: str) -> list[str]:
    return matching(path, RANK_GLOB)


def input_bytes(path: str) -> int | None:
    """The bytes of the diag rank files in directory `path` that are regular files, a gzipped
    one's uncompressed as `safeio.plain_size` estimates them (its size on disk is 5-10x under what
    reading it holds) (None: it holds no rank file; a dangling link, a FIFO or a device is the
    reader's to report, not read here)."""
    files = _rank_files(path)
    total = 0
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            continue
        total += safeio.plain_size(f) if stat.S_ISREG(st.st_mode) else 0
    return total if files else None


def available_bytes() -> int:
    """Memory this process may still use: the kernel's MemAvailable, under a cgroup's limit."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit) as f:
                text = f.read().strip()
            if text.isdigit():
                avail = min(avail or int(text), int(text))
        except OSError:
            continue
    return avail or 1 << 62
