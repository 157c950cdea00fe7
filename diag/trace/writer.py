"""Append-only, private, failure-tolerant writing of one rank's trace file.

The file is created 0600 with O_NOFOLLOW|O_EXCL semantics on a fresh name, so another user cannot
plant a link or read the job's data. A failed write (disk full, I/O error) never raises: the lines
are counted as lost and the writer keeps trying on the next flush.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

FILE_MODE = 0o600
DIR_MODE = 0o700


def rank_file_name(rank: int | None, pid: int) -> str:
    """`rank-00003.jsonl`, or `pid-1234.jsonl` for a process whose rank is unknown."""
    return f"rank-{rank:05d}.jsonl" if rank is not None else f"pid-{pid}.jsonl"


def open_private(path: str) -> tuple[int, str]:
    """Create a fresh file 0600 for appending and return (fd, path). Refuses symlinks; when `path`
    exists (an earlier attach to the same rank) the next free `name.N.jsonl` is used, so each file
    has exactly one header and nothing is appended to a file someone else may have planted."""
    stem, ext = os.path.splitext(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
    n = 0
    while True:
        candidate = path if n == 0 else f"{stem}.{n}{ext}"
        try:
            return os.open(candidate, flags, FILE_MODE), candidate
        except FileExistsError:
            n += 1


class TraceFileWriter:
    """Writes JSON lines to one file descriptor; counts what could not be written."""

    def __init__(self, directory: str, file_name: str) -> None:
        os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
        self._fd, self.path = open_private(os.path.join(directory, file_name))
        self.lines_written = 0
        self.lines_lost = 0
        self.last_error: str | None = None

    def write_objects(self, objs: list[dict[str, Any]]) -> None:
        if objs:
            self.write_lines([json.dumps(o, separators=(",", ":"), default=str) for o in objs])

    def write_lines(self, lines: list[str]) -> None:
        """One `write` per batch: a SIGKILL leaves whole lines plus at most one partial last line."""
        if not lines or self._fd < 0:
            self.lines_lost += len(lines)
            return
        data = ("\n".join(lines) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            self.lines_written += len(lines)
        except OSError as e:
            self.lines_lost += len(lines)
            self.last_error = errno.errorcode.get(e.errno or 0, str(e))

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            finally:
                self._fd = -1
