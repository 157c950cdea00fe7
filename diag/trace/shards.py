"""`lockstep`'s second pass in forked worker processes, a shard of the rank files each (issue 14).

Parsing the stepped lines and making frames of them is most of a windowed analysis' time (56% of
its CPU at 256 ranks x 16 steps, docs/scale.md), one core's while the others idle. Each worker is
forked once the first pass is done (`StepFile.scan` and `place`: headers, ranks and late group
names, settled across the files), so it holds every file's state as the main process has it; it
reads its shard's files a window at a time as `lockstep` reads them in-process (`_Reading`), and
turns its window's records into frames a run of its files at a time (`CHUNK_RECORDS`: one frame a
kind and run, `perfile.part`, where `build_frames` would take them all at once). The main process
joins the shards' frames in file order (`perfile.frame_of`: the join `PerFile` gives the whole
read, with `reader._finish`), so each window's trace is the in-process one. It asks for the next
window as soon as it has this one: the workers parse it while the caller reduces this one.

A window whose shards' columns cannot be joined (`Uneven`: a column of numbers in one shard and of
text in another) raises `Uneven` with that window's first step, and `lockstep` reads the files
again in-process from there. A worker's error (`OutOfStep` included) is raised in the main
process; a run ended early (an error, ^C) kills the workers.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from typing import TYPE_CHECKING, Any, NamedTuple

from diag.errors import DiagError
from diag.trace import perfile, workers
from diag.trace.model import LoadProblem
from diag.trace.perfile import Uneven
from diag.trace.safeio import plain_size
from diag.trace.window import Window

if TYPE_CHECKING:
    import pandas as pd

PARALLEL_BYTES = 32 << 20  # total bytes of rank files above which workers are used (as `rankfiles`)
# one a core, none left spare: the main process mostly waits for the next window (256 ranks x 16
# steps on 2 cores: in-process 15.2 s, one worker 12.3 s, two 10.7 s, docs/scale.md)
MIN_CORES, SPARE = 2, 0
# a worker's window records made into frames this many at a time (a run of its files): as dicts,
# its whole shard's window was most of a worker's memory (1,024 ranks: ~220 MiB PSS each)
CHUNK_RECORDS = 8_192


class Got(NamedTuple):
    """A window as read: its frames by kind (None: it holds no record), the problems of making
    them, the kinds of its records, and the lowest step the files hold after it (None: none)."""

    frames: dict[str, pd.DataFrame] | None
    problems: list[LoadProblem]
    kinds: set[str]
    rest: int | None


Taken = list[list[tuple[int, dict[str, Any]]]]  # (line, record) of each file's window, by file
# (readings, taken, kinds) -> records by kind, file by file (`lockstep.by_kind`)
ByKind = Callable[[list[Any], Taken, set[str]], dict[str, list[dict[str, Any]]]]


def workers_for(files: list[str]) -> int:
    """Workers for the windowed reading of `files`: `workers.workers_for`'s policy, one a core (none
    where this OS cannot fork)."""
    if not hasattr(os, "fork"):
        return 0
    return workers.workers_for(files, PARALLEL_BYTES, MIN_CORES, SPARE)


class WorkerError(DiagError):
    """A worker ended without an answer, or failed with an exception that does not pickle (its
    summary in the message); one that pickles is raised as it is."""


class Shards:
    """`n` forked workers, each reading a contiguous run of `readings` (`lockstep._Reading`)."""

    def __init__(self, readings: list[Any], n: int, window: Window, most: int, by_kind: ByKind) -> None:
        self.readings, self.by_kind = readings, by_kind
        self.bounds = _bounds([r.file.path for r in readings], n)
        self._pids: list[int] = []
        self._conns: list[Connection] = []
        self._asked: tuple[int, int] | None = None  # the window the workers are reading
        for sys_stream in (sys.stdout, sys.stderr):  # (a child's exit must not write them again)
            sys_stream.flush()
        gc.freeze()  # the parent's objects out of the children's collections: their pages stay shared
        try:
            for a, b in self.bounds:
                mine, theirs = Pipe()
                pid = os.fork()
                if pid == 0:  # pragma: no cover (the child: coverage does not follow it)
                    for end in (mine, *self._conns):  # held here, the main process' ends would
                        end.close()  # never read as closed: no EOF for a worker it left
                    _child(theirs, readings[a:b], window, most, by_kind)
                theirs.close()
                self._pids.append(pid)
                self._conns.append(mine)
        except BaseException:
            self.close()
            raise
        finally:
            gc.unfreeze()

    def first(self) -> int | None:
        """The lowest step the files' first `most` stepped records hold (`lockstep._Local.first`)."""
        return _least(self._ask(("first",)))

    def ask(self, lo: int, hi: int) -> None:
        """The window [lo, hi) read ahead, while the caller works on the last one."""
        self._send(("window", lo, hi))
        self._asked = (lo, hi)

    def take(self, lo: int, hi: int, frames: bool = True) -> Got:
        """The window [lo, hi) (`_Local.take`; its frames made whether or not `frames`). Raises
        `Uneven` (its `args[0]`: `lo`) where its shards' frames cannot be joined."""
        if self._asked != (lo, hi):
            self.ask(lo, hi)
        self._asked = None
        got = self._recv()
        rest = _least([g[2] for g in got])
        if not any(g[1] for g in got):
            return Got(None, [], set(), rest)
        if any(g[0] is None for g in got):
            raise Uneven(lo)
        from diag.trace.reader import _finish

        kinds = {kind for g in got for kind in g[0]}
        out = {}
        try:
            for kind in kinds:
                out[kind] = perfile.frame_of(kind, self._parts(kind, got), _finish)
        except Uneven:
            raise Uneven(lo) from None
        return Got(out, [], kinds, rest)

    def _parts(self, kind: str, got: list[Any]) -> list[perfile.Part]:
        """`kind`'s frames in file order: each shard's, or, where its window held none of that kind,
        its files' records of no step of it (those `build_frames` would have taken with the rest)."""
        runs = [(self.readings[a:b], frames) for (a, b), (frames, _, _) in zip(self.bounds, got)]
        return in_file_order(kind, runs, self.by_kind)

    def finish(self) -> None:
        """Every file read to its end: each reading's `outside` and its file's `problems` set as
        the in-process reading sets them. Raises `OutOfStep` as it would."""
        for (a, b), (outside, problems) in zip(self.bounds, self._ask(("end",))):
            for r, mine, theirs in zip(self.readings[a:b], outside, problems):
                r.outside, r.file.problems = mine, theirs
        self.close()

    def close(self) -> None:
        """The workers ended (killed where one is still reading) and reaped."""
        for conn in self._conns:
            conn.close()
        for pid in self._pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self._conns, self._pids = [], []

    def _ask(self, msg: tuple[Any, ...]) -> list[Any]:
        self._send(msg)
        return self._recv()

    def _send(self, msg: tuple[Any, ...]) -> None:
        for conn in self._conns:
            conn.send(msg)

    def _recv(self) -> list[Any]:
        got = []
        for conn in self._conns:
            try:
                what, value = conn.recv()
            except EOFError:
                raise WorkerError(
                    "a worker process reading the trace ended without an answer (killed: out of "
                    "memory?); DIAG_WORKERS=0 reads it in this process"
                ) from None
            if what == "raise":
                raise value
            if what == "error":
                raise WorkerError(f"a worker reading the trace failed: {value}")
            got.append(value)
        return got


def _bounds(paths: list[str], n: int) -> list[tuple[int, int]]:
    """`n` runs of the files (fewer where there are fewer files), in file order, of about the same
    bytes each and at least one file each."""
    sizes = [max(1, plain_size(p)) for p in paths]  # (a gzipped file: uncompressed)
    n, total, a, acc = min(n, len(paths)), sum(sizes), 0, 0
    out: list[tuple[int, int]] = []
    for i, size in enumerate(sizes):
        acc += size
        must = len(paths) - (i + 1) == n - 1 - len(out)  # one file left for each run after this one
        if len(out) < n - 1 and (acc * n >= total * (len(out) + 1) or must):
            out.append((a, i + 1))
            a = i + 1
    out.append((a, len(paths)))
    return out


def _least(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _child(conn: Connection, readings: list[Any], window: Window, most: int, by_kind: ByKind) -> None:
    """A worker's life: answer the main process' asks until "end" or its going away; never return."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the main process' to handle
        _serve(conn, readings, window, most, by_kind)
    except (EOFError, BrokenPipeError, OSError):
        code = 1  # the main process is gone
    finally:
        os._exit(code)  # no atexit, no flush of the parent's buffers, no return into its stack


def _serve(conn: Connection, readings: list[Any], window: Window, most: int, by_kind: ByKind) -> None:
    while True:
        msg = conn.recv()
        try:
            if msg[0] == "first":
                for r in readings:
                    r.fill(None, float("-inf"), window, most)
                value: Any = _least([min(r.steps(), default=None) for r in readings])
            elif msg[0] == "window":
                value = _window(readings, msg[1], msg[2], window, most, by_kind)
            else:
                for r in readings:
                    r.fill(None, float("inf"), window, 1)
                    r.check_drained()
                value = ([r.outside for r in readings], [r.file.problems for r in readings])
        except Exception as e:  # noqa: BLE001 (sent to the main process, which raises it)
            conn.send(_failure(e))
            return
        conn.send(("ok", value))
        if msg[0] == "end":
            return


def _window(
    readings: list[Any], lo: int, hi: int, window: Window, most: int, by_kind: ByKind
) -> tuple[dict[str, list[perfile.Part]] | None, int, int | None]:
    """This shard's (frames by kind, each a list of parts in file order (None: `Uneven`), records
    taken, lowest step held after). Its files are taken a run at a time, each run's records made
    into frames before the next run is read (`CHUNK_RECORDS`)."""
    runs: list[tuple[list[Any], dict[str, list[perfile.Part]]]] = []
    count, held, start, taken = 0, 0, 0, []
    joined: dict[str, list[perfile.Part]] | None = None
    try:
        for i, r in enumerate(readings):
            r.fill(lo, hi, window, most)
            taken.append(r.take(lo, hi))
            held += len(taken[-1])
            if held >= CHUNK_RECORDS or i == len(readings) - 1:
                run, count, held, start = readings[start : i + 1], count + held, 0, i + 1
                kinds = {rec["k"] for records in taken for _, rec in records}
                rows = by_kind(run, taken, kinds)
                taken.clear()  # (the run's records are now only its rows, dropped as made frames)
                runs.append((run, {kind: [perfile.part(rows.pop(kind))] for kind in sorted(kinds)}))
        kinds = {kind for _, frames in runs for kind in frames}
        joined = {kind: in_file_order(kind, runs, by_kind) for kind in kinds}
    except Uneven:
        for r in readings[start:]:  # (the rest of the window read and dropped, as in one run)
            r.fill(lo, hi, window, most)
            count += len(r.take(lo, hi))
    return joined, count, _least([min(r.steps(), default=None) for r in readings])


def in_file_order(
    kind: str, runs: list[tuple[list[Any], dict[str, list[perfile.Part]]]], by_kind: ByKind
) -> list[perfile.Part]:
    """`kind`'s parts of consecutive runs of the files (shards, or a worker's runs of its shard), in
    file order: a run's own, or, where the window held no record of that kind in the run, a part
    of its files' records of no step of that kind (those `build_frames` would have taken with the
    rest of the window)."""
    parts: list[perfile.Part] = []
    for run, frames in runs:
        if kind in frames:
            parts += frames[kind]
            continue
        rows = by_kind(run, [[] for _ in run], {kind})[kind]
        if rows:
            parts.append(perfile.part(rows))
    return parts


def _failure(e: Exception) -> tuple[str, Any]:
    """How a worker's exception travels: itself where it pickles, else its one-line summary."""
    import pickle

    try:
        pickle.dumps(e)
    except Exception:  # noqa: BLE001
        return ("error", traceback.format_exception_only(e)[-1].strip())
    return ("raise", e)


__all__ = ["Got", "Shards", "Uneven", "WorkerError", "workers_for"]
