"""Incremental reading of a trace directory that is still being written.

Each poll reads only the bytes appended since the last one; a partial last line (the writer is
mid-write, or was killed) stays buffered until its newline arrives. Lines are parsed by the
reader's own `parse_line`, so live and post-mortem views agree on what a record is. Files on a
shared filesystem (ranks on other nodes) are followed the same way.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

from diag.trace.reader import TRACE_GLOB, parse_line

MAX_READ = 8 << 20  # bytes per file per poll: a huge backlog is read over several polls


@dataclass
class Chunk:
    """New records of one file: `header` is set on the poll that first saw it."""

    path: str
    header: dict[str, Any] | None
    events: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0


class FileTail:
    """One append-only JSON-lines file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.header: dict[str, Any] | None = None
        self.skipped = 0

    def read(self) -> Chunk | None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_READ)
        except OSError:
            return None
        if not data:
            return None
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()  # b"" when the data ended with a newline
        chunk = Chunk(self.path, None)
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
                chunk.events.append(obj)
        self.skipped += chunk.skipped
        return chunk if chunk.header or chunk.events or chunk.skipped else None


class DirTail:
    """Every trace file of a directory, including files that appear later (late ranks, sidecars)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[str, FileTail] = {}

    def discover(self) -> None:
        for pat in TRACE_GLOB:
            for path in glob.glob(os.path.join(self.directory, pat)):
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
