"""What the watcher saw of each rank's process, kept in the trace directory for the post-mortem.

A rank throttled from outside (a SIGSTOP/SIGCONT duty cycle, as cpulimit does) leaves nothing in its
own trace that tells it from a rank a loaded host slowed: only a look at its process from outside
sees it stopped (state T) and resumed again and again. `diag watch` looks every 20 ms
(`rank_deaths.LOOK_S`); this log sums those looks per rank over each second and appends one `proc`
record per rank and second to `<trace_dir>/proc-<host>.jsonl` (its own header, `"sidecar": "watch"`),
which `diag.load` reads with the rank files (`Trace.proc`) and the straggler rule reads post-mortem
with the same thresholds as live (`diag.metrics.throttle`). Without a watcher there is no such file
and the post-mortem says nothing of a throttle.

About 150 bytes a rank and second (0.5 MB an hour for a host's 8 ranks). A directory it cannot
write to (another user's, a read-only mount) leaves the watch working without the log.
"""

from __future__ import annotations

import os
import time
from typing import Any

from diag import schema
from diag.trace.writer import TraceFileWriter

RECORD_S = 1.0  # one record per rank and this many seconds of looks


class _Window:
    """One rank's looks since its last record."""

    def __init__(self, start_ns: int, pid: int | None) -> None:
        self.start_ns, self.pid = start_ns, pid
        self.looks = self.stopped = self.resumes = 0
        self.first_stop: int | None = None
        self.last_stop: int | None = None
        self.exit: int | None = None  # its wait status, seen while it was a zombie

    def record(self, rank: int, end_ns: int, state: str) -> dict[str, Any]:
        return {
            "k": schema.PROC,
            "ts": end_ns,
            "of_rank": rank,
            "pid": self.pid,
            "span": end_ns - self.start_ns,
            "looks": self.looks,
            "stopped": self.stopped,
            "resumes": self.resumes,
            "first_stop": self.first_stop,
            "last_stop": self.last_stop,
            "state": state,
            "exit": self.exit,
        }


class ProcLog:
    """Per rank, the looks of the current second; a record per rank once it is over."""

    def __init__(self, trace_dir: str, host: str) -> None:
        self.trace_dir, self.host = trace_dir, host
        self.windows: dict[int, _Window] = {}
        self.last: dict[int, str] = {}  # rank -> state at its last look (a resume spans two records)
        self.file: TraceFileWriter | None = None
        self.error: str | None = None  # why nothing is written (the directory refused the file)

    def add(self, facts: dict[int, dict[str, Any]]) -> None:
        """One look at every rank (`rank_deaths.process_facts`): counted, written once a second."""
        done = []
        for rank, f in facts.items():
            now, state = int(f["checked_ns"]), str(f["state"])
            w = self.windows.get(rank)
            if w is None:
                w = self.windows[rank] = _Window(now, f.get("pid"))
            w.looks += 1
            if "exit" in f:
                w.exit = int(f["exit"])
            if state == "T":
                w.stopped += 1
                w.first_stop = w.first_stop or now
                w.last_stop = now
            elif self.last.get(rank) == "T" and state != "gone":
                w.resumes += 1
            self.last[rank] = state
            if now - w.start_ns >= RECORD_S * 1e9:
                done.append(w.record(rank, now, state))
                self.windows[rank] = _Window(now, f.get("pid"))
        self._write(done)

    def close(self) -> None:
        """The seconds begun and not yet written, then the file closed."""
        now = time.time_ns()
        self._write([w.record(r, now, self.last.get(r, "?")) for r, w in self.windows.items() if w.looks])
        self.windows.clear()
        if self.file is not None:
            self.file.close()
            self.file = None

    def _write(self, records: list[dict[str, Any]]) -> None:
        if not records or self.error is not None:
            return
        if self.file is None:
            try:
                self.file = TraceFileWriter(self.trace_dir, f"proc-{self.host}.jsonl")
            except OSError as e:
                self.error = e.strerror or str(e)
                return
            self.file.write_objects([self.header()])
        self.file.write_objects(records)

    def header(self) -> dict[str, Any]:
        return {
            "k": "header",
            "schema": schema.SCHEMA_VERSION,
            "sidecar": "watch",
            "rank": None,
            "host": self.host,
            "pid": os.getpid(),
            "start_ts": time.time_ns(),
            "record_s": RECORD_S,
        }
