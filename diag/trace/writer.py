"""Append-only, private, failure-tolerant writing of one rank's trace file.

The file is created 0600 with O_NOFOLLOW|O_EXCL semantics on a fresh name, so another user cannot
plant a link or read the job's data. A failed write (disk full, I/O error) never raises: the lines
are counted as lost, cut back to whole lines, recorded in the file as a `lost` record once space
returns, and the writer keeps trying on the next flush.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import json.encoder
import math
import os
import time
from collections.abc import Callable
from typing import Any

from diag.schema import LOST

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
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    n = 0
    while True:
        candidate = path if n == 0 else f"{stem}.{n}{ext}"
        try:
            return os.open(candidate, flags, FILE_MODE), candidate
        except FileExistsError:
            n += 1


def _encoder() -> Callable[[Any], str]:
    """`json.dumps(obj, separators=(",", ":"), default=str, allow_nan=False)` with the C encoder made
    once, not per call (half the writer's cost per record); json.dumps where there is no C encoder.
    No circular-reference markers: a cycle ends in RecursionError, which `dumps` handles."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return functools.partial(json.dumps, separators=(",", ":"), default=str, allow_nan=False)
    encode = make(None, str, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False)
    return lambda obj: "".join(encode(obj, 0))


_encode = _encoder()


def dumps(obj: dict[str, Any]) -> str:
    """Strict JSON: readers refuse NaN / Infinity (not JSON), so a non-finite float the job handed
    us (a loss scale, a config value) is written as null at the top level, as its text below it."""
    try:
        return _encode(obj)
    except (ValueError, RecursionError):
        pass
    try:
        clean = {k: None if _non_finite(v) else _finite(v) for k, v in obj.items()}
        return json.dumps(clean, separators=(",", ":"), default=str, allow_nan=False)
    except (ValueError, RecursionError):  # a cycle: keep the scalars, the rest as short text
        flat = {
            k: v
            if v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v))
            else str(v)[:200]
            for k, v in obj.items()
        }
        return json.dumps(flat, separators=(",", ":"), default=str, allow_nan=False)


def _non_finite(v: Any) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def _finite(v: Any) -> Any:
    if _non_finite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def make_private_dirs(directory: str) -> None:
    """`os.makedirs` with DIR_MODE for every folder it creates, not only the last: the others would
    take the job's umask (0o022 gives 0o755, readable by every local user)."""
    parent = os.path.dirname(os.path.abspath(directory))
    if parent != directory and not os.path.isdir(parent):
        make_private_dirs(parent)
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(directory):
            raise
        return
    os.chmod(directory, DIR_MODE)  # mkdir's mode is masked by the umask too


def _steps_of(lines: list[str], steps: list[Any] | None, start: int) -> list[Any]:
    """The steps of `lines[start:]` (lost): from `steps`, else read back from the lines (a JSON line
    has the step its record had: an int step is the same int; any other is not counted)."""
    if steps is not None:
        return steps[start:]
    out = []
    for line in lines[start:]:
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        out.append(obj.get("step") if isinstance(obj, dict) else None)
    return out


class TraceFileWriter:
    """Writes JSON lines to one file descriptor; counts what could not be written.

    A line is never torn: a batch that fails part-way (disk full) is cut back with `ftruncate` to
    the end of the last whole line, so a reader never mistakes a full disk for a killed process.
    What was lost is written as a `lost` record (how many lines, which steps, why) with the next
    batch that fits, so the trace itself says where it has holes."""

    def __init__(self, directory: str, file_name: str) -> None:
        make_private_dirs(directory)
        self._fd, self.path = open_private(os.path.join(directory, file_name))
        self.lines_written = 0
        self.lines_lost = 0
        self.last_error: str | None = None
        self._pending: list[int] = [0, -1, -1]  # lost and not yet recorded: lines, first, last step

    def write_objects(self, objs: list[dict[str, Any]]) -> None:
        if objs:
            self.write_lines([dumps(o) for o in objs], [o.get("step") for o in objs])

    def write_lines(self, lines: list[str], steps: list[Any] | None = None) -> None:
        """One `write` per batch: a SIGKILL leaves whole lines plus at most one partial last line;
        a failed write leaves whole lines only (those after the last whole one are lost). `steps`
        (each line's step, for the `lost` record) is read back from the lost lines when not given:
        the agent's flushes do not keep one beside each line for a write that nearly never fails."""
        if not lines:
            return
        if self._fd < 0:
            self._lose(_steps_of(lines, steps, 0))
            return
        lost = self._lost_line() if self._pending[0] else None
        head = [lost] if lost else []
        data = "\n".join(itertools.chain(head, lines, ("",))).encode()  # one copy each, no concat
        whole, error = self._write_whole(data)
        if head and whole >= 1:
            self._pending = [0, -1, -1]  # the earlier loss is on record now
        done = max(0, whole - len(head))
        self.lines_written += done
        if error is not None:
            self.last_error = error
            self._lose(_steps_of(lines, steps, done))

    def _write_whole(self, data: bytes) -> tuple[int, str | None]:
        """(lines written, error or None): on a failure the file is cut back to the end of its
        last whole line, so what fitted stays and nothing is torn."""
        done = 0
        try:
            done = os.write(self._fd, data)  # nearly always all of it: no view made
            while done < len(data):
                done += os.write(self._fd, memoryview(data)[done:])
            return data.count(b"\n"), None
        except OSError as e:
            good = data.rfind(b"\n", 0, done) + 1
            try:  # O_APPEND and one writer: the batch's `done` bytes are the file's last ones
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - done + good)
            except OSError:
                pass  # cannot cut back: the reader reports the torn line as such
            return data.count(b"\n", 0, good), errno.errorcode.get(e.errno or 0, str(e))

    def _lose(self, steps: list[Any]) -> None:
        self.lines_lost += len(steps)
        pending = self._pending
        pending[0] += len(steps)
        known = [x for x in steps if type(x) is int]
        if known:
            pending[1] = min(known) if pending[1] < 0 else min(pending[1], *known)
            pending[2] = max(pending[2], *known)

    def _lost_line(self) -> str | None:
        lines, first, last = self._pending
        if not lines:
            return None
        return json.dumps(
            {
                "k": LOST,
                "ts": time.time_ns(),
                "lines": lines,
                "first_step": first if first >= 0 else None,
                "last_step": last if last >= 0 else None,
                "error": self.last_error,
            },
            separators=(",", ":"),
        )

    def close(self) -> None:
        if self._fd >= 0:
            try:
                lost = self._lost_line()
                if lost and self._write_whole((lost + "\n").encode())[1] is None:
                    self._pending = [0, -1, -1]
                os.close(self._fd)
            finally:
                self._fd = -1

    def forget(self) -> None:
        """Close this process's descriptor without writing (a forked child's copy of the parent's)."""
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
