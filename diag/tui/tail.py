"""Incremental reading of a trace directory that is still being written.

Each poll reads only the bytes appended since the last one; a partial last line (the writer is
mid-write, or was killed) stays buffered until its newline arrives. Lines are parsed by the
reader's own `parse_line`, so live and post-mortem views agree on what a record is. Files on a
shared filesystem (ranks on other nodes) are followed the same way. Only regular files are
followed (a FIFO would block a poll forever), and a line is held at most `safeio.max_line_bytes()`.
A gzipped file (by its first bytes: an archived trace, `gzip rank-*.jsonl`) is a finished one: it is
read through once, `MAX_READ` uncompressed bytes a poll, from one stream held open, and not followed
after its end (a gzip file that grows is rewritten whole, not appended to).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from diag.trace import group_members, safeio
from diag.trace.reader import TRACE_GLOB, TWINS, capture_of, gzip_twins, matching, of_capture, parse_line

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

    def __init__(self, path: str, refused: str | None = None) -> None:
        self.path = path
        self.refused = refused  # why the file is left out, said on its first poll
        self.offset = 0
        self.partial = b""
        self.header: dict[str, Any] | None = None
        self.skipped = 0
        self.discarding = False  # inside a line longer than the limit, until its newline
        self.problem: str | None = None
        self.fill = group_members.Fill()  # a call's group ranks its line omits
        self.gzipped: ExitStack | None = None  # a gzipped file's stream, open until its end
        self.stream: BinaryIO | None = None
        self.finished = False  # a gzipped file read to its end (or to a break in its stream)

    def read(self) -> Chunk | None:
        if self.refused is not None:
            self.problem, self.refused = self.refused, None
            return Chunk(self.path, None, problem=self.problem)
        if self.problem is not None:
            return None
        try:
            data, cut = self._next()
        except safeio.InputError as e:
            self.problem = str(e)
            return Chunk(self.path, None, problem=self.problem)
        except OSError:
            return None
        self.problem = cut
        if not data:
            return Chunk(self.path, None, problem=cut) if cut else None
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()  # b"" when the data ended with a newline
        chunk = Chunk(self.path, None, problem=cut)
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
        return chunk if chunk.header or chunk.events or chunk.skipped or cut else None

    def _next(self) -> tuple[bytes, str | None]:
        """The bytes appended since the last poll, or of a gzipped file (its first bytes say so)
        its next uncompressed ones from a stream held open, and where that broke, why. A gzipped
        file's end (or break) closes it: a finished file, not followed further."""
        if self.stream is None:
            if self.finished:
                return b"", None
            with safeio.open_regular(self.path) as f:
                f.seek(self.offset)
                data = f.read(MAX_READ)
            if self.offset or data[:2] != safeio.GZIP_MAGIC:
                return data, None
            self.gzipped = ExitStack()
            self.stream = self.gzipped.enter_context(safeio.open_lines(self.path))
        data, cut = safeio.read_upto(self.stream, MAX_READ)
        if (cut is not None or len(data) < MAX_READ) and self.gzipped is not None:
            self.gzipped.close()
            self.stream, self.gzipped, self.finished = None, None, True
        return data, cut


class DirTail:
    """Every trace file of a directory, including files that appear later (late ranks, sidecars).
    Of the captures a directory holds (a later attach writes `rank-N.K.jsonl` beside the first's
    files), only the newest is followed: the live one; merged, their steps collided."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[str, FileTail] = {}
        self.capture = 0  # the capture followed (`reader.capture_of`)

    def discover(self) -> None:
        found = matching(self.directory, TRACE_GLOB)
        newest = max((capture_of(path)[0] for path in found), default=0)
        if newest > self.capture:  # a later attach into the directory: its files, not the earlier's
            self.capture = newest
            self.files = {path: self.files[path] for path in of_capture(list(self.files), newest)}
        twins = gzip_twins(found)  # (the plain one may be live; the gzipped one, a copy)
        for path in of_capture(found, self.capture):
            if path not in self.files:
                self.files[path] = FileTail(path, f"left out: {TWINS}" if path in twins else None)

    def poll(self) -> list[Chunk]:
        self.discover()
        out = []
        for path in sorted(self.files):
            chunk = self.files[path].read()
            if chunk is not None:
                out.append(chunk)
        return out
