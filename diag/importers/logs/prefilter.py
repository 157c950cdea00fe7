"""Read a log at close to disk speed: only the lines a reader can use become `Line`s.

Most of a long log is lines no reader uses (a model's own prints, warnings, data loader chatter), and a
`Line` (decode, prefix peeling) costs far more than finding out that a line is not one of those. So the
file is read in large binary chunks and each line searched with one compiled alternation of `ANCHORS`: a
piece of each of `KEYWORDS` (the words every recognized line contains: each reader's own `in` guard, see
the readers, plus `[Rank`, a rank named in the text) that starts with a byte rare in logs. The engine
tries the alternation only where a line holds one of the anchors' first bytes, so anchors starting `x`,
`z`, `_`, `{` or a capital cost far less than the words' own common first letters (keyword search 0.67
-> 0.42 s CPU on 50 MiB of the bench's input with NCCL/warning chatter, 0.30 -> 0.23 s on the
fixture-only input, with no more lines let through on either). A line holding an anchor but no keyword
is only offered to readers that ignore it. Only lines with an anchor, and every line while a reader is
in the middle of a block (`busy`: DeepSpeed's JSON dump, an open traceback, a torchrun failure report),
are decoded and yielded, so every reader sees exactly the lines it acted on before; inside Megatron's
arguments dump or DeepSpeed's config dump, which read only some lines without a keyword, `busy` gives
the bytes pattern of those (the chatter between a dump's lines, or after a config dump no `json = {`
closes, stays bytes). The ranks and hosts the launcher prefixes of the other lines name are still counted
(the run's ranks), in line order: each such line's head (its first tokens holding a `:`, which covers
every prefix `lines.Line` peels) is taken by one anchored regex, and each distinct head is parsed once.
A kept line of a frequent family (the anchor found names which: `fastpath`) is read by one regex match
into its reader's state, without becoming a `Line` offered to every reader.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from diag.importers.errors import ImportProblem
from diag.importers.logs.lines import Line, open_log, peel
from diag.trace import safeio

CHUNK = 4 << 20  # bytes read at a time
KEYWORDS = (
    # crash.CrashReader
    b"Traceback",
    b"ChildFailedError",
    b"Watchdog caught",
    b"exitcode:",
    b"exits with return code",
    b"Segmentation fault",
    b"terminate called after throwing",
    # megatron.MegatronReader
    b"iteration",
    b"arguments",
    b"using world size:",
    b"parallel group",
    b"padded vocab",
    b"global_step=",
    # deepspeed.DeepSpeedReader
    b"skipped=",
    b"SamplesPerSec=",
    b"iter time (s)",
    b"Skipping step",
    b"DeepSpeedEngine configuration",
    b"print]",
    b"dist_world_size=",
    b"Discovered MPI settings",
    b"global_rank_mapping=",
    b"ZeRO stage",
    b"ProcessCoord(",
    b"Max_MA",
    # hf.HFReader
    b"it]",
    b"it/s]",
    b"{'",
    b"Instantaneous batch size per device",
    b"Total train batch size",
    b"Gradient Accumulation steps",
    b"Total optimization steps",
    # verl.VerlReader
    b"step:",
    # nanogpt.NanoGPTReader
    b"ms, mfu ",
    b", val loss ",
    # torchtitan.TorchtitanReader (its metrics line holds `step:`, verl's)
    b"device mesh with",
    # lines.Line: a rank named in the text
    b"[Rank",
)


# one piece of each keyword (so every line with a keyword holds one), starting with a byte rare in logs
ANCHORS = (
    b"Traceback",
    b"FailedError",
    b"Watchdog caught",
    b"xitcode:",
    b"xits with return code",
    b"Segmentation fault",
    b"fter throwing",
    b"iteration",
    b"guments",
    b"world size:",
    b"group",
    b"vocab",
    b"_step=",
    b"kipped=",
    b"PerSec=",
    b"time (s)",
    b"kipping step",
    b"Engine configuration",
    b"int]",
    b"_world_size=",
    b"MPI settings",
    b"_rank_mapping=",
    b"ZeRO stage",
    b"ProcessCoord(",
    b"x_MA",
    b"it]",
    b"it/s]",
    b"{'",
    b"ze per device",
    b"Total train",
    b"Accumulation steps",
    b"zation steps",
    b"tep:",
    b"mfu ",
    b"val loss ",
    b"mesh with",  # `m` is a first byte already (`mfu `): no slower (an anchor at `B`/`D`: +12% scan)
    b"Rank",
)


def _trie(words: list[bytes]) -> bytes:
    """One regex for `words` with common prefixes factored out (the engine tries fewer branches)."""
    tree: dict[bytes, dict] = {}
    for w in words:
        node = tree
        for c in w:
            node = node.setdefault(bytes([c]), {})
        node[b""] = {}
    return _alternation(tree)


def _alternation(node: dict[bytes, dict]) -> bytes:
    alts = [b"" if c == b"" else re.escape(c) + _alternation(sub) for c, sub in sorted(node.items())]
    return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"


KEY = re.compile(_trie(list(ANCHORS)))  # a line holding a keyword (bench.logs times it alone)
# a line's (or a `\r` piece's) head: leading blanks, then up to 3 tokens that hold a `:` (every launcher
# prefix ends with one and holds no blank; the parse stops at the first token without one)
_HEAD = (
    rb"(?:>(?=[\s>]|$)|\x1b\[[\d;]*m|\((?:[A-Za-z_][\w.]* )?pid=\d+(?:, ip=[\d.]+)?\)|[ \t\f\v])*"
    rb"(?:[^\s:]*:\S*[ \t\f\v]*){0,3}"
)
_HEAD_AT = re.compile(_HEAD).match
_HEADS_KEPT = 1 << 16
# lines with no keyword remembered (the shorter ones): a log repeats its chatter (a warning each step,
# NCCL's INFO lines, a data loader's prints), and a line seen before needs neither search nor head
QUIET_KEPT, QUIET_LINE = 4096, 512  # distinct heads remembered (a timestamp in a head makes each second new)


class Fast(Protocol):
    """The frequent lines' fast path (`fastpath.FastLines`)."""

    by_anchor: dict[bytes, tuple[tuple[Any, Any], ...]]
    pieces: tuple[tuple[Any, Any], ...]

    def usable(self, chunk: bytes) -> bool: ...

    def blocked(self) -> bool: ...

    def line(self, m: re.Match[bytes], no: int, handler: Any) -> bool: ...


def keyword_lines(
    path: str,
    busy: Callable[[], bool | re.Pattern[bytes]],
    rank_seen: Callable[[int, str | None], None],
    fast: Fast | None = None,
) -> Iterator[Line]:
    """The lines of `path` that hold a keyword, and every line while `busy()`; `rank_seen(rank, host)`
    for the launcher prefix of each other line, in line order (as offering every line calls it); the
    lines `fast.regex` matches read by `fast` instead, in line order. Same limits and problems as
    `lines.read_lines`."""
    with open_log(path) as stream:
        try:
            yield from _lines(stream, busy, rank_seen, fast)  # type: ignore[arg-type]
        except (EOFError, OSError, gzip.BadGzipFile) as e:
            raise ImportProblem(f"truncated or corrupt gzip ({e})") from None


def _lines(
    stream: object,
    busy: Callable[[], bool | re.Pattern[bytes]],
    rank_seen: Callable[[int, str | None], None],
    fast: Fast | None,
) -> Iterator[Line]:
    limit, max_line = safeio.max_input_bytes(), safeio.max_line_bytes()
    read = stream.read  # type: ignore[attr-defined]
    heads = _Heads(rank_seen)
    total = 0
    no = 0  # lines before the chunk
    rest = b""
    skipping = False  # inside a line past max_line: dropped up to its newline
    while True:
        data = read(CHUNK)
        total += len(data)
        if total > limit:
            raise ImportProblem(safeio.too_big("decompresses to more than", limit))
        if not data:
            chunk, rest = rest, b""
            if not chunk:
                return
        else:
            buf = rest + data if rest else data
            end = buf.rfind(b"\n")
            if end < 0:
                rest = buf
                if len(rest) > max_line:
                    rest, skipping = b"", True
                continue
            chunk, rest = buf[: end + 1], buf[end + 1 :]
            if len(rest) > max_line:
                rest, skipping = b"", True
        start = 0
        if skipping:  # the tail of a line past the limit: counts as a line, yields nothing
            start = chunk.find(b"\n") + 1 or len(chunk)
            skipping = False
        if fast is not None and not fast.usable(chunk):
            fast = None
        yield from _chunk_lines(chunk, start, no, max_line, busy, heads, fast)
        no += chunk.count(b"\n") + (not chunk.endswith(b"\n"))


class _Heads:
    """The rank (and host) each distinct line head names, reported once (`rank_seen`) for the lines
    no reader is offered: a parse per distinct head, not per line."""

    def __init__(self, rank_seen: Callable[[int, str | None], None]) -> None:
        self.seen: set[bytes] = set()
        self.quiet: set[bytes] = set()  # recent lines with no keyword, their heads reported
        self.rank_seen = rank_seen

    def line(self, b: bytes) -> None:
        """A line with `\r` pieces: each piece has its head."""
        for piece in b.split(b"\r"):
            h = _HEAD_AT(piece).group()  # type: ignore[union-attr]
            if h not in self.seen:
                self.new(h)

    def new(self, h: bytes) -> None:
        if len(self.seen) > _HEADS_KEPT:
            self.seen.clear()
        self.seen.add(h)
        rank, host, _ = peel(h.decode("utf-8", "replace"))
        if rank >= 0:
            self.rank_seen(rank, host)


def _chunk_lines(
    chunk: bytes,
    start: int,
    no: int,
    max_line: int,
    busy: Callable[[], bool | re.Pattern[bytes]],
    heads: _Heads,
    fast: Fast | None,
) -> Iterator[Line]:
    """The chunk's (complete) lines with a keyword, and all lines while `busy()`; `no`: the lines
    before the chunk. The other lines' heads go to `heads`, in line order; the lines `fast` reads
    (a keyword line its regex matches whole, no reader in a block) go to it."""
    lines = chunk[start:].split(b"\n")
    if chunk.endswith(b"\n"):
        lines.pop()
    no += chunk.count(b"\n", 0, start)
    search = KEY.search
    seen, head_at, quiet = heads.seen, _HEAD_AT, heads.quiet
    families = fast.by_anchor if fast is not None else {}
    read = fast.line if fast is not None else None
    every = busy()
    # a fast line starts or ends no block: whether the fast path may read (`fast.blocked()`) changes
    # only with a line the readers are offered
    blocked = fast is None or fast.blocked()
    for b in lines:
        no += 1
        if len(b) > max_line:
            continue
        if every is not True and (every is False or not every.search(b)):  # type: ignore[union-attr]
            if b in quiet:  # the same line again (a warning, a library's INFO line): done before
                continue
            k = search(b)
            if k is None:  # the hot loop of a long log: most lines end here
                if b"\r" in b:
                    heads.line(b)
                elif (h := head_at(b).group()) not in seen:  # type: ignore[union-attr]
                    heads.new(h)
                    seen = heads.seen  # `new` may have begun a new set
                if len(b) <= QUIET_LINE:
                    if len(quiet) >= QUIET_KEPT:
                        quiet.clear()
                    quiet.add(b)
                continue
            if not blocked and (fams := families.get(k.group())) is not None:
                for matcher, handler in fams:  # noqa: B007 - the first family whose regex matches whole
                    if m := matcher(b):
                        break
                if m and read(m, no, handler):  # type: ignore[misc]
                    continue  # `busy()` is what it was
        yield from _line(b, no, fast)
        every = busy()
        blocked = fast is None or fast.blocked()


def _line(b: bytes, no: int, fast: Fast | None = None) -> Iterator[Line]:
    """Line `no`, or its pieces: a progress bar rewrites its line with `\r`, each piece counts (a bar
    piece read by `fast`)."""
    if b"\r" not in b:
        raw = b.decode("utf-8", "replace")
        if raw:
            yield Line(raw, no)
        return
    pieces = b.rstrip(b"\r\n").split(b"\r")
    if fast is None:
        for piece in pieces:
            if piece:
                yield Line(piece.decode("utf-8", "replace"), no)
        return
    families, read = fast.pieces, fast.line
    blocked = fast.blocked()
    for piece in pieces:
        if not piece:
            continue
        if not blocked:
            for matcher, handler in families:  # noqa: B007 - the first family whose regex matches whole
                if m := matcher(piece):
                    break
            if m and read(m, no, handler):
                continue  # a bar (or a log dict) read by `fast`: `blocked()` is what it was
        yield Line(piece.decode("utf-8", "replace"), no)
        blocked = fast.blocked()
