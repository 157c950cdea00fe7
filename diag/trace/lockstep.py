"""diag's rank files read forward together, a window of steps at a time (issue 14, docs/scale.md).

`load_trace` holds the whole job: its peak is about 100 MiB plus half the input. Every cross-rank
reader aligns calls within one step, so a window of steps, every rank's, is all one needs at once:
`LockStep(path, size)` yields one `Part` per window of `size` steps, in step order, whose trace is
the one `load_trace(path, window=Window(ranks, lo, lo + size))` gives (frames, headers, layout,
hosts; its problems are not repeated in each window). The first window starts at the user's
`window.lo`, else at the lowest step the files' first records hold; a window no record falls in (a
gap in the steps) is skipped, not yielded empty. Records of no step (header, meta, stats, NVML
samples) are in every window, as `Window` keeps them. Records of a negative step (calls outside
every step) are in no window: they and the step-less ones make up `outside`, set, with every
problem of the reading (those `load_trace` reports, in its order), once the windows are done.

Each file is read forward twice (`stepfile`: its step-less records first, then its stepped lines a
window at a time), never held whole: each file holds its window's records and at most `ahead`
records of later steps (a layer record written a few steps late still finds its window). A record
of a window already yielded raises `OutOfStep`, for the caller to read the trace whole instead.
`ahead` is by default the job's share of `AHEAD_TOTAL`: held as dicts (~1 KB a record), 1,024 a
file was about 1 GB at 1,024 ranks, a trace's whole input at 16 steps (`bench.analyze
--diag-trace 1024x16 --windowed`); the share keeps at least `AHEAD_MIN` (about a step of the ZeRO-3
sample's records: the writer holds a record back a flush or two, `agent.pending`).

Given `workers` (default: `shards.workers_for` the files), the second pass runs in forked worker
processes, a run of the files each (`trace.shards`), and gives the same windows.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, NamedTuple

from diag.errors import DiagError
from diag.trace import shards
from diag.trace.model import LoadProblem, Trace
from diag.trace.reader import Unreadable, build_frames, is_int, named_outside, trace_files
from diag.trace.shards import Got
from diag.trace.stepfile import OutOfStep, Record, StepFile
from diag.trace.window import ALL, Window

__all__ = ["AHEAD", "AHEAD_MIN", "AHEAD_TOTAL", "LockStep", "OutOfStep", "Part", "ahead_for"]

AHEAD = 1_024  # records of later steps a file may hold: ~14 steps of the ZeRO-3 sample's 71 a step
AHEAD_TOTAL = 65_536  # ... and all files together, unless each would then hold under AHEAD_MIN
AHEAD_MIN = 96


def ahead_for(files: int) -> int:
    """Records of later steps each of `files` files may hold by default."""
    return min(AHEAD, max(AHEAD_MIN, AHEAD_TOTAL // max(files, 1)))


class Part(NamedTuple):
    """One window's steps and their trace."""

    window: Window
    trace: Trace


class _Reading:
    """One file's second pass, with what it read ahead of the window (by step, in line order)."""

    def __init__(self, file: StepFile) -> None:
        self.file = file
        self.records = file.stepped()
        self.ahead: dict[int, list[tuple[int, Record]]] = {}
        self.outside: list[tuple[int, Record]] = []  # records of a negative step: in no window
        self.eof = False

    def fill(self, lo: int | None, hi: float, wanted: Window, most: int) -> None:
        """Read on until `most` records of steps from `hi` on are held, or the file ends."""
        beyond = sum(len(held) for step, held in self.ahead.items() if step >= hi)
        while not self.eof and beyond < most:
            got = next(self.records, None)
            if got is None:
                self.eof = True
                break
            step, line, rec = got
            if not wanted.wants_step(step):
                continue
            if step < 0:
                self.outside.append((line, rec))
            elif lo is not None and step < lo:
                raise OutOfStep(f"{self.file.path}:{line}: step {step} after the window {lo}: was given")
            else:
                self.ahead.setdefault(step, []).append((line, rec))
                beyond += step >= hi

    def take(self, lo: int, hi: int) -> list[tuple[int, Record]]:
        """The held records of steps in [lo, hi), as (line, record) in line order; the rest stay held."""
        steps = [step for step in self.ahead if lo <= step < hi]
        if len(steps) == 1:
            return self.ahead.pop(steps[0])
        taken = [got for step in steps for got in self.ahead.pop(step)]
        taken.sort(key=lambda got: got[0])  # (runs in order: merged)
        return taken

    def steps(self) -> list[int]:
        return list(self.ahead)

    def check_drained(self) -> None:
        """At the file's end (`fill` to infinity): a record still held is of a window given already."""
        for step, held in self.ahead.items():
            raise OutOfStep(f"{self.file.path}:{held[0][0]}: step {step} after its window was given")


class LockStep:
    """`for part in LockStep(path, 10): ...` then `.outside` and `.problems` (see the module);
    `ahead` None: `ahead_for` the files read."""

    def __init__(
        self,
        path: str,
        size: int,
        window: Window = ALL,
        *,
        strict: bool = False,
        ahead: int | None = None,
        workers: int | None = None,
    ) -> None:
        if size < 1:
            raise DiagError(f"a window of {size} steps: it must hold at least one")
        self.path, self.size, self.window, self.strict, self.ahead = path, size, window, strict, ahead
        self.workers = workers
        self.headers: dict[int, Record] = {}
        self.problems: list[LoadProblem] = []
        self.outside: Trace | None = None  # set once every window is given
        self._files: list[StepFile] = []
        self._still: dict[str, Any] | None = None  # the frames of the kinds of no step
        self._still_problems: list[LoadProblem] = []  # build_frames' on them

    def __iter__(self) -> Iterator[Part]:
        self.headers, self.problems, self.outside, self._still = {}, [], None, None  # (read anew)
        readings = self._scan()
        if readings is None:
            return
        most = self.ahead if self.ahead is not None else ahead_for(len(readings))
        n = self.workers if self.workers is not None else shards.workers_for([r.file.path for r in readings])
        resume = None
        if n and not self.strict:
            source = shards.Shards(readings, n, self.window, most, by_kind)
            try:
                yield from self._windows(readings, source)
                return
            except shards.Uneven as e:  # read in-process from the first window on, those given skipped
                resume = e.args[0]
            finally:
                source.close()
        yield from self._windows(readings, _Local(readings, self.window, most, self.path), resume)

    def _windows(
        self, readings: list[_Reading], source: _Local | shards.Shards, resume: int | None = None
    ) -> Iterator[Part]:
        """The windows `source` reads, those before step `resume` read but not given."""
        lo = self.window.lo if self.window.lo is not None else source.first()
        while lo is not None:
            hi = self._hi(lo)
            given = resume is None or lo >= resume
            got = source.take(lo, hi, given)
            self._check()
            after = lo + self.size * ((got.rest - lo) // self.size) if got.rest is not None else None
            after = after if hi != self.window.hi else None
            if after is not None:
                source.ask(after, self._hi(after))  # (workers read it while the caller takes this one)
            if got.frames is not None and given:
                yield Part(Window(self.window.ranks, lo, hi), self._trace(readings, got))
            lo = after
        source.finish()  # the user's window ended (the rest dropped) or every file did
        self._check()
        self.problems = self._problems()
        self.outside = self._trace(readings, _frames(readings, [r.outside for r in readings], self.path))
        self.outside.problems = self.problems

    def _hi(self, lo: int) -> int:
        return lo + self.size if self.window.hi is None else min(lo + self.size, self.window.hi)

    def _scan(self) -> list[_Reading] | None:
        """Every file's first pass, its rank settled as `reader.read_into` settles it; the files
        of ranks not wanted read to their end for their problems. None: no window to give."""
        files = trace_files(self.path)
        self._files = [StepFile(f) for f in files if not named_outside(f, self.window)]
        skipped = len(files) - len(self._files)
        readings = []
        for f in self._files:
            f.scan()
            rank = _rank(f)
            if f.header is None or (rank is not None and not self.window.wants_rank(rank)):
                skipped += f.header is not None
                f.drain()
                continue
            f.place(rank, None if rank is None else self.headers.setdefault(rank, dict(f.header)))
            readings.append(_Reading(f))
        self._check()
        if not self.headers:
            for r in readings:
                r.file.drain()
            self.problems = self._problems()
            if skipped and not self.problems:
                self.outside = Trace(sources=[self.path])  # every rank outside the window
                return None
            raise Unreadable(self.problems or [LoadProblem(self.path, "no readable trace")])
        return readings

    def _check(self) -> None:
        """With `strict`, the first problem `load_trace` would stop at, once one is seen."""
        if self.strict and any(f.troubled() for f in self._files):
            for f in self._files:
                if f.problems is None:
                    f.drain()
            raise DiagError(str(self._problems()[0]))

    def _problems(self) -> list[LoadProblem]:
        return [p for f in self._files for p in f.problems or ()]

    def _trace(self, readings: list[_Reading], got: Got) -> Trace:
        """A trace of each file's step-less records and a window's (`got`: file by file, in line
        order, as `load_trace` adds them), with every rank's header. A kind of no record in the
        window has the same frame in every window, made once (a shallow copy each: a column added
        is the window's own); meta's alone cost a sixth of the reading, made again each window."""
        if self._still is None:
            self._still_problems = []
            self._still = build_frames(by_kind(readings, None), self._still_problems, self.path)
        frames, problems = dict(got.frames or {}), list(got.problems)
        frames.update({k: df.copy(deep=False) for k, df in self._still.items() if k not in got.kinds})
        # (build_frames' message begins with the kind it skipped)
        problems += [p for p in self._still_problems if p.message.split(" ", 1)[0] not in got.kinds]
        return Trace({r: dict(h) for r, h in self.headers.items()}, frames, problems, [self.path])


class _Local:
    """The windows read in this process (`Shards` reads them in workers)."""

    def __init__(self, readings: list[_Reading], window: Window, most: int, path: str) -> None:
        self.readings, self.window, self.most, self.path = readings, window, most, path

    def first(self) -> int | None:
        """The lowest step the files' first `most` stepped records hold (None: no step at all)."""
        for r in self.readings:
            r.fill(None, float("-inf"), self.window, self.most)
        return min((step for r in self.readings for step in r.steps()), default=None)

    def take(self, lo: int, hi: int, frames: bool = True) -> Got:
        """The window [lo, hi): its frames (None where it holds no record; empty where not `frames`)."""
        for r in self.readings:
            r.fill(lo, hi, self.window, self.most)
        taken = [r.take(lo, hi) for r in self.readings]
        rest = min((step for r in self.readings for step in r.steps()), default=None)
        if not any(taken):
            return Got(None, [], set(), rest)
        return _frames(self.readings, taken, self.path, rest) if frames else Got({}, [], set(), rest)

    def ask(self, lo: int, hi: int) -> None:
        """(Nothing to read ahead in-process.)"""

    def finish(self) -> None:
        for r in self.readings:
            r.fill(None, float("inf"), self.window, 1)
            r.check_drained()

    def close(self) -> None:
        """(No worker to end.)"""


def _frames(
    readings: list[_Reading], taken: list[list[tuple[int, Record]]], path: str, rest: int | None = None
) -> Got:
    """The frames of the files' `taken` records and of their step-less ones of the same kinds."""
    kinds = {rec["k"] for records in taken for _, rec in records}
    problems: list[LoadProblem] = []
    return Got(build_frames(by_kind(readings, taken, kinds), problems, path), problems, kinds, rest)


def by_kind(
    readings: list[_Reading], taken: list[list[tuple[int, Record]]] | None, kinds: set[str] | None = None
) -> dict[str, list[Record]]:
    """The records of `kinds` (None: every kind of no step) by kind: each file's step-less ones
    and its `taken`, file by file and in line order."""
    out: dict[str, list[Record]] = defaultdict(list)
    for i, r in enumerate(readings):
        mine: dict[str, list[tuple[int, Record]]] = defaultdict(list)
        for got in taken[i] if taken is not None else ():
            mine[got[1]["k"]].append(got)
        for kind in r.file.still_by_kind if kinds is None else kinds:
            still, part = r.file.still_by_kind.get(kind, []), mine.get(kind, [])
            merged = heapq.merge(still, part, key=lambda got: got[0]) if still and part else still or part
            out[kind].extend(rec for _, rec in merged)
    return out


def _rank(f: StepFile) -> int | None:
    """The file's rank as `reader.read_into` settles it: its header's, its meta's, or minus its pid;
    None for a sidecar or a file of no header."""
    if f.header is None or f.header.get("sidecar"):
        return None
    rank: Any = f.header.get("rank")
    if rank is None:
        rank = next(
            (
                rec.get("value")
                for _, rec in f.still
                if rec.get("k") == "meta" and rec.get("key") == "rank" and is_int(rec.get("value"))
            ),
            None,
        )
    return -int(f.header.get("pid") or 0) if rank is None else int(rank)
