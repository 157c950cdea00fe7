"""Where `diag top` gets its records: a live trace directory, a pid, or a replayed trace.

A source has `poll() -> list[Chunk]` (called by the app's worker thread), `describe()` and `live`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections.abc import Callable

from diag.errors import FAILURE, USAGE, DiagError
from diag.trace import safeio
from diag.trace.reader import trace_files
from diag.tui.tail import Chunk, DirTail

RANK_FILE = re.compile(r"(rank|pid)-\d+\.jsonl")  # the names the agent writes (trace.writer)


class LiveSource:
    """Follow a trace directory as its files grow (a local job, or a shared filesystem). With
    `wait`, a directory that does not exist yet is waited for (`diag top DIR` started before the
    job); a path that exists but is not a directory is refused."""

    live = True

    def __init__(self, trace_dir: str, label: str | None = None, wait: bool = False) -> None:
        if os.path.exists(trace_dir) and not os.path.isdir(trace_dir):
            raise DiagError(f"{trace_dir}: not a trace directory (a file)")
        if not wait and not os.path.isdir(trace_dir):
            raise DiagError(f"{trace_dir}: no such trace directory")
        self.trace_dir = trace_dir
        self.label = label or trace_dir
        self.tail = DirTail(trace_dir)
        self.paused = False

    def poll(self) -> list[Chunk]:
        return self.tail.poll()

    def describe(self) -> str:
        if not os.path.isdir(self.trace_dir):
            return f"live {self.label} (waiting: the directory does not exist yet)"
        return _noted(f"live {self.label}", self.tail)


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
        tail = self.tail = DirTail(trace_dir)
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
        return _noted(f"replay {self.label or self.trace_dir} ({speed})", self.tail)


def capture_note(tail: DirTail) -> str:
    """Where a directory holds several captures (a later attach's `rank-N.K.jsonl`), which one is
    shown: the newest, not a merge of them; "" where it holds one."""
    if not tail.capture:
        return ""
    k = tail.capture
    return f"following capture {k}, the newest (rank-N.{k}.jsonl): `diag analyze --each-run` reads each"


def _noted(text: str, tail: DirTail) -> str:
    """A source's description, with the capture it follows where the directory holds several."""
    note = capture_note(tail)
    return f"{text} ({note})" if note else text


def _ts(ev: dict) -> int:
    """A record's time for ordering the replay; 0 when it has none a reader can use (a string)."""
    ts = ev.get("ts")
    return int(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else 0


def trace_dir_of_pid(pid: int) -> str:
    """The trace directory of a job given a rank's pid or its launcher's (torchrun, deepspeed): the
    first rank whose trace directory is found. A DiagError that says why otherwise."""
    try:
        from diag.procs import ranks_under
    except ImportError:  # psutil comes with diag[attach]: without it, the pid is taken as a rank's

        def ranks_under(pid: int) -> list[tuple[int, int | None]]:
            if not os.path.exists(f"/proc/{pid}"):
                raise DiagError(f"no such process: {pid}", USAGE) from None
            return [(pid, None)]

    ranks = ranks_under(pid)  # "no such process" for a pid that is gone
    first: DiagError | None = None
    for rank_pid, _ in ranks:
        try:
            return _rank_trace_dir(rank_pid)
        except DiagError as e:
            first = first or e
    assert first is not None
    if ranks != [(pid, None)]:
        raise DiagError(f"pid {pid}: none of its {len(ranks)} rank(s) is attached ({first})", FAILURE)
    raise first


def _rank_trace_dir(pid: int) -> str:
    """One process's trace directory: its control socket's `status` first; else the trace file
    it holds open (an agent started in-process, without a control socket); else DIAG_TRACE_DIR in
    its environment, or ./diag-trace of its working directory when a file there has its pid."""
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
    held = _open_trace_dir(pid)
    if held is not None:
        return held
    for d, need_pid in _candidate_dirs(pid):
        if (not need_pid and os.path.isdir(d)) or _has_pid(d, pid):
            return d
    raise DiagError(
        f"pid {pid} is not attached: run `diag attach {pid}` first "
        "(no control socket and no trace file of that pid)",
        FAILURE,
    )


def _open_trace_dir(pid: int) -> str | None:
    """The directory of a rank trace file the process has open for writing (its agent's writer)."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if RANK_FILE.fullmatch(os.path.basename(target)) and os.path.isfile(target):
            return os.path.dirname(target)
    return None


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
