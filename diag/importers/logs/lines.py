"""The shared line model: what every log family sees once the launcher's prefixes are peeled off.

A line of a multi-rank log usually carries who printed it before the framework's own text:
torchrun's `[default3]:` (local rank) and torch's `[rank3]:` (global rank), srun's `--label` `3: `,
pdsh/DeepSpeed multi-node `worker-0: ` / `10.0.0.1: ` (host), DeepSpeed's `[Rank 3]` (log_dist), and a
timestamp (`[2023-08-02 00:41:17,935]`, `2023-08-02 00:41:17.936`, NeMo's `[NeMo I 2024-06-17 08:36:41`).
A log pasted into a README, an issue or a chat carries more in front: markdown quote markers (`> `), and
Ray's per-actor prefix (verl and other Ray jobs: `(WorkerDict pid=12345)`, `(TaskRunner pid=..,
ip=10.0.0.2)`, often wrapped in ANSI colour codes); they are peeled too (Ray's `ip=` is the host; a pid
is no rank).
`Line` keeps the text after the prefixes, the rank and host they name, and parses the timestamp only
when a reader asks for it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import IO

from diag.importers.errors import ImportProblem
from diag.trace import safeio

_SKIP = 1 << 20  # characters read at a time while skipping a line past the limit

_PREFIX = re.compile(
    r"\s*(?:"
    r">(?=[\s>]|$)|"  # a markdown quote marker (a log pasted in an issue or a README)
    r"\x1b\[[\d;]*m|"  # an ANSI colour code (Ray colours its prefixes)
    r"\((?:[A-Za-z_][\w.]* )?pid=\d+(?:, ip=(?P<ip>[\d.]+))?\)|"  # Ray: `(WorkerDict pid=1, ip=10.0.0.2)`
    r"\[default(?P<local>\d+)\]:|"  # torchrun --tee / --log-dir console prefix (local rank)
    r"\[rank(?P<rank>\d+)\]:|"  # torch >= 2.2 C++/Python log prefix (global rank)
    r"(?P<label>\d{1,5}):(?=\s)|"  # srun --label
    r"(?P<host>[A-Za-z][\w.-]*-\d+|\d{1,3}(?:\.\d{1,3}){3}):(?=\s)"  # pdsh: worker-0: / 10.0.0.1:
    r")\s?"
)
# a line's head: leading blanks, quote markers, ANSI codes and a Ray prefix, then up to 3 tokens holding a
# `:`; every prefix lies in it (each launcher prefix ends with a `:` and holds no blank; the parse stops at
# the first token without one), so its parse is remembered
_HEAD_RE = (
    r"(?:>(?=[\s>]|$)|\x1b\[[\d;]*m|\((?:[A-Za-z_][\w.]* )?pid=\d+(?:, ip=[\d.]+)?\)|\s)*"
    r"(?:[^\s:]*:\S*\s*){0,3}"
)
_HEAD = re.compile(_HEAD_RE)
_HEADS: dict[str, tuple[int, str | None, int]] = {}
_SECONDS: dict[tuple[str, ...], int | None] = {}
_HEADS_KEPT = 1 << 16  # entries remembered at most (a timestamp in a head makes each second new)
_RANK_IN_TEXT = re.compile(r"\[Rank\s+(\d+)\]")
_TS = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
NUM = re.compile(_NUM, re.IGNORECASE)
NUM_BYTES = rb"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"  # a finite number as float() reads it


class Line:
    """One log line: `text` without launcher prefixes, `rank` (-1 unknown), `host`, `no` (1-based)."""

    __slots__ = ("_ts", "host", "no", "rank", "raw", "text")

    def __init__(self, raw: str, no: int) -> None:
        self.raw, self.no = raw, no
        self._ts: int | bool | None = False
        head = _HEAD.match(raw).group()  # type: ignore[union-attr]
        got = _HEADS.get(head)
        if got is None:
            if len(_HEADS) > _HEADS_KEPT:
                _HEADS.clear()
            got = _HEADS[head] = peel(head)
        self._peeled(*got)  # type: ignore[arg-type]

    def _peeled(self, rank: int, host: str | None, end: int) -> None:
        self.rank, self.host = rank, host
        text = self.text = self.raw[end:]
        if rank < 0 and "[Rank" in text and (r := _RANK_IN_TEXT.search(text)):
            self.rank = int(r.group(1))

    @property
    def ts(self) -> int | None:
        """The line's own timestamp in ns (UTC-naive wall clock), None if it has none."""
        if self._ts is False:
            m = _TS.search(self.text, 0, 60)
            self._ts = None
            if m:
                sec = _seconds(m.group(1, 2, 3, 4, 5, 6))
                if sec is None:
                    return None
                frac = (m.group(7) or "0")[:9].ljust(9, "0")
                self._ts = sec * 1_000_000_000 + int(frac)
        return self._ts  # type: ignore[return-value]


class BytesLine(Line):
    """A line the fast path read (its head printable ASCII, split by `peel` once per distinct head):
    `raw` and `text` are decoded only when a reader asks (the timestamp of a step's first line), not
    for every line: most of a multi-rank log's lines only update a record that exists."""

    __slots__ = ("_b", "_end")

    def __init__(self, b: bytes, no: int, rank: int, host: str | None, end: int) -> None:
        self._b, self._end, self.no, self._ts, self.rank, self.host = b, end, no, False, rank, host
        if rank < 0 and b"[Rank" in b:
            self._peeled(rank, host, end)  # the rank named in the text, read as `Line` reads it

    def __getattr__(self, name: str) -> str:
        """`raw` and `text` (slots left unset until asked for)."""
        if name not in ("raw", "text"):
            raise AttributeError(name)
        self.raw = self._b.decode("utf-8", "replace")  # the head is ASCII: `_end` counts characters too
        self.text = self.raw[self._end :]
        return self.raw if name == "raw" else self.text


def peel(text: str) -> tuple[int, int | None, int] | tuple[int, str | None, int]:
    """(rank or -1, host, where the text starts) from the launcher prefixes at the start of `text`."""
    rank, host, pos = -1, None, 0
    for _ in range(8):  # they nest: `worker-1: [default0]:[rank8]: `, `> \x1b[36m(TaskRunner pid=7)\x1b[0m `
        m = _PREFIX.match(text, pos)
        if m is None:
            break
        if m.group("rank") or m.group("label"):
            rank = int(m.group("rank") or m.group("label"))
        elif m.group("local") and rank < 0:
            rank = int(m.group("local"))
        elif m.group("host") or m.group("ip"):
            host = m.group("host") or m.group("ip")
        pos = m.end()
    return rank, host, pos


def _seconds(parts: tuple[str, ...]) -> int | None:
    """Seconds since the epoch of (year, month, day, hour, minute, second), remembered: a log's lines
    share few distinct seconds."""
    got = _SECONDS.get(parts, False)
    if got is False:
        try:
            got = int(datetime(*(int(g) for g in parts), tzinfo=timezone.utc).timestamp())
        except ValueError:
            got = None
        if len(_SECONDS) > _HEADS_KEPT:
            _SECONDS.clear()
        _SECONDS[parts] = got
    return got  # type: ignore[return-value]


def num(text: str | None) -> float | None:
    """A float from a printed number (`1.5E-04`, `nan`, `'0.0002'`); None when it is not one."""
    if text is None:
        return None
    try:
        return float(text)  # most figures: float() skips the blanks around them itself
    except ValueError:
        pass
    try:
        return float(text.strip().strip("'\""))
    except ValueError:
        return None


@contextlib.contextmanager
def open_log(path: str) -> Iterator[IO[bytes]]:
    """A log's bytes, gunzipped when its content is gzip; `ImportProblem` for a file that is not
    regular (a FIFO would block) or a binary file that is not gzip. Both log readers open this way."""
    try:
        f = safeio.open_regular(path)
    except safeio.InputError as e:
        raise ImportProblem(str(e)) from None
    with f:
        head = f.read(4096)
        f.seek(0)
        gz = head[:2] == b"\x1f\x8b"
        if not gz and b"\x00" in head:
            raise ImportProblem("binary file, not a training log")
        yield gzip.open(f) if gz else f  # type: ignore[misc]


def read_lines(path: str) -> Iterator[Line]:
    """The file's lines (gzip by content), decoded leniently; `ImportProblem` for a binary file, a
    file that is not regular (a FIFO would block), or one past the readers' limits (a gzip bomb, a
    line that never ends: `diag.trace.safeio`)."""
    with open_log(path) as binary:
        stream = io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline="\n")
        limit, max_line = safeio.max_input_bytes(), safeio.max_line_bytes()
        total = no = 0
        try:
            while raw := stream.readline(max_line + 1):
                no += 1
                total += len(raw)
                if len(raw) > max_line and not raw.endswith("\n"):  # skipped, never held whole
                    while (rest := stream.readline(_SKIP)) and not rest.endswith("\n") and total <= limit:
                        total += len(rest)
                    total += len(rest)
                    raw = ""
                if total > limit:
                    raise ImportProblem(safeio.too_big("decompresses to more than", limit))
                raw = raw.rstrip("\r\n")
                if "\r" not in raw:
                    if raw:
                        yield Line(raw, no)
                    continue
                for piece in raw.split("\r"):  # a progress bar rewrites its line with \r: each piece counts
                    if piece:
                        yield Line(piece, no)
        except (EOFError, OSError) as e:
            raise ImportProblem(f"truncated or corrupt gzip ({e})") from None
