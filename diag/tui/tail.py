"""Incremental reading of a trace directory that is still being written.

Each poll reads only the bytes appended since the last one; a partial last line (the writer is
mid-write, or was killed) stays buffered until its newline arrives. Lines are parsed by the
reader's own `parse_line`, so live and post-mortem views agree on what a record is. Files on a
shared filesystem (ranks on other nodes) are followed the same way. Only regular files are
followed (a FIFO would block a poll forever), and a line is held at most `safeio.max_line_bytes()`.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

from diag.trace import group_members, safeio
from diag.trace.reader import TRACE_GLOB, capture_of, of_capture, parse_line

MAX_READ = 8 << 20  # bytes per file per poll: a huge backlog is read over several polls


@dataclass
class Chunk:
    """New records of one file: `header` is set on the poll that first saw it."""

    path: str
    header: dict[str, Any] | None
    events: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    problem: str | None = None  # set once when the file cannot be followed (a FIFO, a device)


class FileTail:
    """One append-only JSON-lines file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.header: dict[str, Any] | None = None
        self.skipped = 0
        self.discarding = False  # inside a line longer than the limit, until its newline
        self.problem: str | None = None
        self.fill = group_members.Fill()  # a call's group ranks its line omits

    def read(self) -> Chunk | None:
        if self.problem is not None:
            return None
        try:
            with safeio.open_regular(self.path) as f:
                f.seek(self.offset)
                data = f.read(MAX_READ)
        except safeio.InputError as e:
            self.problem = str(e)
            return Chunk(self.path, None, problem=self.problem)
        except OSError:
            return None
        if not data:
            return None
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()  # b"" when the data ended with a newline
        chunk = Chunk(self.path, None)
        if self.discarding and lines:  # the rest of an over-long line: not a record
            lines.pop(0)
            self.discarding = False
        if len(self.partial) > safeio.max_line_bytes():  # a line that never ends: not held whole
            self.partial, self.discarding = b"", True
            chunk.skipped += 1
        for line in lines:
            if not line.strip():
                continue
            obj, _why = parse_line(line)
            if obj is None:
                chunk.skipped += 1
            elif obj["k"] == "header":
                if self.header is None:
                    self.header = chunk.header = obj
            else:
                self.fill(obj)
                chunk.events.append(obj)
        self.skipped += chunk.skipped
        return chunk if chunk.header or chunk.events or chunk.skipped else None


class DirTail:
    """Every trace file of a directory, including files that appear later (late ranks, sidecars).
    Of the captures a directory holds (a later attach writes `rank-N.K.jsonl` beside the first's
    files), only the newest is followed: the live one; merged, their steps collided."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[str, FileTail] = {}
        self.capture = 0  # the capture followed (`reader.capture_of`)

    def discover(self) -> None:
        found = sorted({path for pat in TRACE_GLOB for path in glob.glob(os.path.join(self.directory, pat))})
        newest = max((capture_of(path)[0] for path in found), default=0)
        if newest > self.capture:  # a later attach into the directory: its files, not the earlier's
            self.capture = newest
            self.files = {path: self.files[path] for path in of_capture(list(self.files), newest)}
        for path in of_capture(found, self.capture):
            if path not in self.files:
                self.files[path] = FileTail(path)

    def poll(self) -> list[Chunk]:
        self.discover()
        out = []
        for path in sorted(self.files):
            chunk = self.files[path].read()
            if chunk is not None:
                out.append(chunk)
        return out
