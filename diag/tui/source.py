"""Where `diag top` gets its records: a live trace directory, a pid, or a replayed trace.

A source has `poll() -> list[Chunk]` (called by the app's worker thread), `describe()` and `live`.
"""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Callable

from diag.errors import FAILURE, DiagError
from diag.trace import safeio
from diag.trace.reader import trace_files
from diag.tui.tail import Chunk, DirTail


class LiveSource:
    """Follow a trace directory as its files grow (a local job, or a shared filesystem)."""

    live = True

    def __init__(self, trace_dir: str, label: str | None = None) -> None:
        if not os.path.isdir(trace_dir):
            raise DiagError(f"{trace_dir}: no such trace directory")
        self.trace_dir = trace_dir
        self.label = label or trace_dir
        self.tail = DirTail(trace_dir)
        self.paused = False

    def poll(self) -> list[Chunk]:
        return self.tail.poll()

    def describe(self) -> str:
        return f"live {self.label}"


class ReplaySource:
    """Play a finished trace as if live: records are released when the replay clock, started at
    the first record and running `speed` times real time, passes their `ts`. speed <= 0: all at
    once (tests, snapshots)."""

    live = False

    def __init__(
        self,
        trace_dir: str,
        speed: float = 1.0,
        label: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        trace_files(trace_dir)  # a clear DiagError for a missing / empty directory
        self.trace_dir, self.speed, self.label, self.clock = trace_dir, speed, label, clock
        self.paused = False
        self._headers: list[Chunk] = []
        self._queue: list[tuple[int, str, dict]] = []
        tail = DirTail(trace_dir)
        first: dict[str, Chunk] = {}  # per file: header, skipped lines and problem, on the first poll
        while chunks := tail.poll():
            for c in chunks:
                meta = first.setdefault(c.path, Chunk(c.path, None))
                meta.header = meta.header or c.header
                meta.skipped += c.skipped
                meta.problem = meta.problem or c.problem
                self._queue.extend((_ts(e), c.path, e) for e in c.events)
        self._headers = list(first.values())
        self._queue.sort(key=lambda t: t[0])
        self._pos = 0
        self.first_ts = self._queue[0][0] if self._queue else 0
        self.last_ts = self._queue[-1][0] if self._queue else 0
        self._elapsed = 0.0
        self._last = clock()

    def poll(self) -> list[Chunk]:
        now = self.clock()
        if not self.paused:
            self._elapsed += now - self._last
        self._last = now
        out, self._headers = self._headers, []
        limit = self.first_ts + self._elapsed * self.speed * 1e9 if self.speed > 0 else float("inf")
        by_path: dict[str, Chunk] = {}
        while self._pos < len(self._queue) and self._queue[self._pos][0] <= limit:
            _, path, ev = self._queue[self._pos]
            by_path.setdefault(path, Chunk(path, None)).events.append(ev)
            self._pos += 1
        return out + list(by_path.values())

    @property
    def done(self) -> bool:
        return self._pos >= len(self._queue)

    def describe(self) -> str:
        speed = "all at once" if self.speed <= 0 else f"x{self.speed:g}"
        return f"replay {self.label or self.trace_dir} ({speed})"


def _ts(ev: dict) -> int:
    """A record's time for ordering the replay; 0 when it has none a reader can use (a string)."""
    ts = ev.get("ts")
    return int(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else 0


def trace_dir_of_pid(pid: int) -> str:
    """The trace directory of an attached (or preloaded) process: its control socket's `status`
    first; else DIAG_TRACE_DIR in its environment, or ./diag-trace of its working directory when
    a file there has its pid. A DiagError that says why otherwise."""
    if not os.path.exists(f"/proc/{pid}"):
        raise DiagError(f"no process {pid}", FAILURE)
    try:
        from diag.control.client import request
    except ImportError:
        request = None  # type: ignore[assignment]
    if request is not None:
        try:
            reply = request(pid, "status", timeout=3.0)
            path = reply.get("trace_dir") or os.path.dirname(reply.get("trace_file") or "")
            if path:
                return str(path)
        except DiagError:
            pass
    for d, need_pid in _candidate_dirs(pid):
        if (not need_pid and os.path.isdir(d)) or _has_pid(d, pid):
            return d
    raise DiagError(
        f"pid {pid} is not attached: run `diag attach {pid}` first "
        "(no control socket and no trace file of that pid)",
        FAILURE,
    )


def _candidate_dirs(pid: int) -> list[tuple[str, bool]]:
    """(directory, whether a file there must carry this pid): DIAG_TRACE_DIR is trusted as is
    (a launcher's ranks inherit it), the default ./diag-trace only with the pid's own file."""
    out = []
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        if env.get(b"DIAG_TRACE_DIR"):
            out.append((os.fsdecode(env[b"DIAG_TRACE_DIR"]), False))
    except OSError:
        pass
    try:
        out.append((os.path.join(os.readlink(f"/proc/{pid}/cwd"), "diag-trace"), True))
    except OSError:
        pass
    return out


def _has_pid(directory: str, pid: int) -> bool:
    """Whether the directory holds a trace file written by `pid`."""
    for path in glob.glob(os.path.join(directory, "*.jsonl")):
        try:
            with safeio.open_regular(path) as f:
                header = json.loads(f.readline(64 << 10) or b"{}")
        except (OSError, ValueError, RecursionError):  # safeio.InputError is a ValueError
            continue
        if isinstance(header, dict) and header.get("pid") == pid:
            return True
    return False
