"""Opening and reading inputs whatever they turn out to be: a FIFO, a device, a gzip bomb.

Every reader (the trace reader, the importers, the TUI's tail) opens through `open_regular`: a
non-blocking open and an `fstat` refuse anything but a regular file before a byte is read, so a FIFO
named `rank-0.jsonl` cannot hang a reader and a link to `/dev/zero` cannot fill its memory. A diag
trace file is read through `open_lines`, which gunzips a file that starts with the gzip magic (an
archived trace: `gzip rank-*.jsonl`), as `read_limited` does a whole document. Reads are bounded by
two documented limits, each overridable by an environment variable:

- `DIAG_MAX_LINE_BYTES` (default 64 MiB): the longest JSON line of a diag trace; longer lines are
  skipped, never held whole.
- `DIAG_MAX_INPUT_BYTES` (default 2 GiB): the most a whole-document input (a Kineto trace, a log)
  may hold once decompressed; a larger file or a gzip bomb is refused once that many bytes are out.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO, cast

MAX_LINE_BYTES = 64 << 20
MAX_INPUT_BYTES = 2 << 30
GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20
_SAMPLE = 1 << 16  # a gzip file's head whose ratio estimates its uncompressed size
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputError(ValueError):
    """An input refused or cut short; `str()` is the one-line reason (the caller adds the path)."""


class GzipCut(InputError):
    """A gzip stream that ends early or breaks mid-file: the lines read before it stand."""


_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def _limit(var: str, default: int) -> int:
    try:
        value = int(os.environ.get(var, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


def max_line_bytes() -> int:
    return _limit("DIAG_MAX_LINE_BYTES", MAX_LINE_BYTES)


def max_input_bytes() -> int:
    return _limit("DIAG_MAX_INPUT_BYTES", MAX_INPUT_BYTES)


def file_size(path: str) -> int:
    """Size in bytes for progress and planning; 0 for what cannot be stat'ed (a dangling link, a
    file gone since it was listed): the reader reports those when it opens them."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def open_regular(path: str) -> BinaryIO:
    """Open `path` for reading only if it is a regular file (links followed); `InputError` else.
    O_NONBLOCK makes the open of a FIFO return at once, so the check happens before any wait."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InputError(e.strerror or str(e)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise InputError(f"{what}, not a regular file: refused")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def open_lines(path: str) -> Iterator[BinaryIO]:
    """`open_regular`, gunzipped as it is read where the file starts with the gzip magic (by
    content, not name: `gzip rank-*.jsonl` archives a trace, and a renamed file reads the same).
    A broken stream raises `GzipCut` from `iter_lines`, after the lines before the break."""
    with open_regular(path) as f:
        if f.read(2) != GZIP_MAGIC:
            f.seek(0)
            yield f
            return
        f.seek(0)
        with gzip.GzipFile(fileobj=f, mode="rb") as g:
            yield cast(BinaryIO, g)  # (a GzipFile reads as one)


def read_head(path: str, n: int) -> bytes:
    """The first `n` bytes of `path` as `open_lines` reads it (fewer where it is shorter or its
    gzip stream breaks first); `InputError` or `OSError` where it cannot be opened."""
    with open_lines(path) as f:
        return read_upto(f, n)[0]


def read_upto(f: BinaryIO, n: int) -> tuple[bytes, str | None]:
    """Up to `n` more bytes of `f` (fewer at its end), and, where its gzip stream broke first,
    why: the bytes before the break are kept (`read(n)` drops those of the call that breaks)."""
    out = bytearray()
    try:
        while len(out) < n and (part := cast(io.BufferedIOBase, f).read1(n - len(out))):
            out += part
    except _GZIP_ERRORS as e:
        return bytes(out), _cut(e)
    return bytes(out), None


def _cut(e: Exception) -> str:
    return f"truncated or corrupt gzip ({e})"


def plain_size(path: str) -> int:
    """`file_size`, uncompressed: a gzip file's size times the ratio its first `_SAMPLE` bytes
    decompress at (a JSON-lines trace compresses 5-10x: its size on disk understates what reading
    it holds). An estimate for planning; its trailer's ISIZE is the size mod 2^32 and only the last
    member's, wrong for the large files where the plan matters."""
    size = file_size(path)
    try:
        with open_regular(path) as f:
            raw = f.read(2)
            raw = raw + f.read(_SAMPLE) if raw == GZIP_MAGIC else b""
    except (InputError, OSError):
        return size
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = len(d.decompress(raw, 64 * _SAMPLE))  # (a bomb's ratio is capped at 64)
    except zlib.error:
        return size
    used = len(raw) - len(d.unconsumed_tail) - len(d.unused_data)
    return size * out // used if used and out else size


def iter_lines(f: BinaryIO, max_line: int) -> Iterator[tuple[bytes | None, bool]]:
    """(line without its newline, ended by a newline) for each line; a line longer than
    `max_line` yields (None, ...) and is skipped in chunks, never held whole. A gzip stream that
    breaks raises `GzipCut` (the line it cut is not yielded)."""
    try:
        yield from _lines(f, max_line)
    except _GZIP_ERRORS as e:
        raise GzipCut(_cut(e)) from None


def _lines(f: BinaryIO, max_line: int) -> Iterator[tuple[bytes | None, bool]]:
    while True:
        line = f.readline(max_line + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1], True
        elif len(line) <= max_line:
            yield line, False  # the last line, without a newline
        else:
            ended = False
            while chunk := f.readline(_CHUNK):
                if chunk.endswith(b"\n"):
                    ended = True
                    break
            yield None, ended


def read_limited(path: str, limit: int | None = None) -> bytes:
    """The whole file, gunzipped when it starts with the gzip magic, at most `limit` bytes
    (default `max_input_bytes()`) after decompression: `InputError` beyond, before reading more."""
    limit = max_input_bytes() if limit is None else limit
    with open_regular(path) as f:
        head = f.read(2)
        if head != GZIP_MAGIC:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise InputError(too_big(f"holds {size:,} bytes, more than", limit))
            f.seek(0)  # read whole: `head + rest` copied the file once more (a 2x peak)
            return _read_at_most(f, limit)
        f.seek(0)
        return _gunzip(f, limit)


def _read_at_most(f: BinaryIO, limit: int) -> bytes:
    """The rest of the file; its size was checked, but it may have grown since (a live log)."""
    expect = max(0, os.fstat(f.fileno()).st_size - f.tell())
    data = f.read(min(expect, limit) + 1)  # read(n) allocates n bytes: never the limit itself
    if len(data) <= min(expect, limit):
        return data
    buf = bytearray(data)
    while chunk := f.read(_CHUNK):
        buf += chunk
        if len(buf) > limit:
            raise InputError(too_big("grew past", limit))
    return bytes(buf)


def _gunzip(f: BinaryIO, limit: int) -> bytes:
    """Decompress every gzip member a chunk at a time, stopping as soon as `limit` is passed."""
    out = bytearray()
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = f.read(_CHUNK)
    try:
        while data:
            out += d.decompress(data, limit + 1 - len(out))  # never 0 (unbounded): checked below
            if len(out) > limit:
                raise InputError(too_big("decompresses to more than", limit))
            if not d.eof:
                data = d.unconsumed_tail or f.read(_CHUNK)
                continue
            data = (d.unused_data or f.read(_CHUNK)).lstrip(b"\0")  # zero padding after a member
            while not data and (more := f.read(_CHUNK)):
                data = more.lstrip(b"\0")
            if data:  # another member
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    except zlib.error as e:
        raise InputError(_cut(e)) from None
    if not d.eof:
        raise InputError("truncated or corrupt gzip (the stream ends early)")
    return bytes(out)


def too_big(what: str, limit: int) -> str:
    return f"{what} the {limit:,} byte input limit: refused (DIAG_MAX_INPUT_BYTES raises it)"
