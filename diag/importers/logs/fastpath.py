"""The frequent lines of a long log read straight into the readers' state: no `Line` parse and no
offer to every reader in turn.

A long training log is mostly a few line families repeated: Megatron's `iteration N/ M | key: value |
...`, DeepSpeed's `step=N, skipped=K, lr=[...]`, its throughput timer, its fp16 `Skipping step` and
`Grad overflow on iteration` lines, the HF Trainer's tqdm bar and log dicts. `prefilter` already finds a
keyword anchor in each line it keeps; the anchor names the families the line may be (`by_anchor`), and one
`fullmatch` of that family's compiled regex on the line's bytes captures its figures in named groups;
a handler hands them to the family's reader (the same methods its per-line reading calls). Megatron's
fields are split at their numbers with one regex call and the keys' sequence (the same in every line of
a run) says which is which, so no Python step runs per field. Every other line goes the per-line way,
which stays the reference (tests/unit/test_logs_prefilter.py compares both on every fixture).

A match must read exactly what the per-line way reads, so each family's pattern is strict: printable
ASCII only (the launcher-prefix head then splits as `lines.Line` splits it: no Unicode blank), the text
before the family's own restricted to what the frameworks print there (a timestamp, DeepSpeed's `[INFO]
[file.py:N:func] [Rank r]`), every other part a number or fixed text, so that no other reader's keyword
can be in it and the readers before the family's pass the line by. What stays possible (`Segmentation
fault` or `ChildFailedError` spelled as a Megatron field name) turns the fast path off for the chunk
(`usable`); while a reader is inside a block that takes every line (`blocked`), and for a line whose
head holds more than launcher prefixes, the line goes the per-line way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from diag.importers.logs.lines import NUM_BYTES as NUM
from diag.importers.logs.lines import BytesLine, Line, peel

if TYPE_CHECKING:
    from diag.importers.logs.crash import CrashReader
    from diag.importers.logs.deepspeed import DeepSpeedReader
    from diag.importers.logs.hf import HFReader
    from diag.importers.logs.megatron import MegatronReader
    from diag.importers.logs.records import Records
    from diag.importers.logs.verl import VerlReader

# `lines._HEAD_RE` on printable ASCII: the same head, matched whole (atomic, so no later part shortens it)
_HEAD = (
    rb"(?P<head>(?>(?:>(?=[ \t>]|$)|\x1b\[[\d;]*m|\((?:[A-Za-z_][\w.]* )?pid=\d+(?:, ip=[\d.]+)?\)|[ \t])*"
    rb"(?:[!-9;-~]*:[!-~]*[ \t]*){0,3}))"
)
_TIME = rb"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\][ \t]*"
_DS_PREFIX = rb"(?:" + _TIME + rb")?(?:\[[A-Z]+\][ \t]*)?(?:\[[\w.]+:\d+:\w+\][ \t]*)?"
_MEGATRON = (
    rb"[ \t]*(?:" + _TIME + rb")?iteration[ \t]+(?P<it>\d+)[ \t]*/[ \t]*\d+[ \t]*\|"
)  # then the fields: `MegatronReader.fast_iteration` reads them when all are `key: number`
_DS_STEP = (
    rb"(?:\[Rank \d+\][ \t]*)?step=(?P<step>\d+),[ \t]*skipped=(?P<skipped>\d+)"
    rb"(?:,[ \t]*lr=\[(?P<lr>[ -\\^-~]*)\])?(?:,[ \t]*mom=\[[\d., ()]*\])?[ \t]*"
)
_DS_TIMER = (
    rb"epoch=\d+/micro_step=\d+/global_step=(?P<gstep>\d+),[ \t]*RunningAvgSamplesPerSec="
    + NUM
    + rb",[ \t]*CurrSamplesPerSec=(?P<sps>"
    + NUM
    + rb")(?:,[ \t]*MemAllocated=(?P<ma>"
    + NUM
    + rb")GB,[ \t]*MaxMemAllocated=(?P<mma>"
    + NUM
    + rb")GB)?[ \t]*"
)
_DS_OVERFLOW = (
    rb"(?:\[deepspeed\][ \t]*)?"
    rb"(?:OVERFLOW![ \t]*Rank[ \t]+(?P<orank>\d+)[ \t]+Skipping step|Overflow detected\.[ \t]*Skipping step|"
    rb"fp16 dynamic loss scale overflow![ \t]*Skipping step)\.?"
    rb"(?:[ \t]*Attempted loss scale:[ \t]*(?P<before>"
    + NUM
    + rb")(?:,[ \t]*reducing to[ \t]*(?P<after>"
    + NUM
    + rb"))?)?[\w ,.]*"
)
_DS_GRAD = rb"Grad overflow on iteration:?[ \t]*(?P<grad>\d+)[ \t]*"
# a tqdm bar (a `\r` piece of its line) whose count and rate `hf.HFReader` reads, nothing after it; the
# bar itself holds no `/` (so the count is the first `N/M` after a `|`)
_BAR = (
    rb"[ \t]*\d{1,3}%\|[^|/\[\r\n]*\|[ \t]*(?P<count>\d+)/(?P<total>\d+)[ \t]*\[[^\]\r\n]*?,[ \t]*"
    rb"(?P<rate>[\d.]+)(?P<unit>s/it|it/s)\][ \t]*"
)
# the HF Trainer's log dict (`hf._DICT`), a line or a `\r` piece after the bar: keys lowercase words,
# values numbers as `hf._FLAT` reads them (bare or quoted), nothing after it
_F = rb"[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|[1-9]\d*|0)"
_V = rb"(?:" + _F + rb"|'" + _F + rb"')"
_HF_DICT = (
    _HEAD.replace(rb"(?:[!-9;-~]*:", rb"(?:(?!\{)[!-9;-~]*:")  # the head's tokens: not the dict's first key
    + rb"(?P<dict>\{'(?:loss|eval_loss|train_runtime|train_loss)': "
    + _V
    + rb"(?:, '[a-z_]+': "
    + _V
    + rb")*\})[ \t]*"
)
# each family's whole line (`fullmatch` of the line's bytes)
MEGATRON = re.compile(_HEAD + _MEGATRON)
DS_STEP = re.compile(_HEAD + _DS_PREFIX + _DS_STEP)
DS_TIMER = re.compile(_HEAD + _DS_PREFIX + _DS_TIMER)
DS_OVERFLOW = re.compile(_HEAD + _DS_PREFIX + _DS_OVERFLOW)
DS_GRAD = re.compile(_HEAD + _DS_PREFIX + _DS_GRAD)
BAR = re.compile(_HEAD + _BAR)
HF_DICT = re.compile(_HF_DICT)
# words a strict pattern still lets through (a field name) that a reader before the family's would take
POISON = (b"Segmentation fault", b"ChildFailedError")
_HEADS_KEPT = 1 << 16
BY_ANCHOR = {
    b"iteration": (MEGATRON, DS_GRAD),
    b"Rank": (DS_STEP, DS_OVERFLOW),
    b"kipped=": (DS_STEP,),
    b"_step=": (DS_TIMER,),
    b"PerSec=": (DS_TIMER,),
    b"kipping step": (DS_OVERFLOW,),
    b"it]": (BAR,),
    b"it/s]": (BAR,),
    b"{'": (HF_DICT,),
}
Handler = Callable[[Line, re.Match[bytes]], bool]
Matcher = Callable[[bytes], re.Match[bytes] | None]


class FastLines:
    """Reads the lines `FAST` matches into the readers' state, as offering them as `Line`s would."""

    def __init__(
        self,
        rec: Records,
        crash: CrashReader,
        megatron: MegatronReader,
        deepspeed: DeepSpeedReader,
        hf: HFReader,
        verl: VerlReader,
        seen: Callable[[int, str | None], None],
    ) -> None:
        self.rec, self.crash, self.megatron, self.deepspeed, self.seen = rec, crash, megatron, deepspeed, seen
        self.hf, self.verl = hf, verl
        self.heads: dict[bytes, tuple[int, str | None, int] | None] = {}
        self.told: set[tuple[int, str | None]] = set()  # (rank, host) pairs `seen` was given
        family: dict[re.Pattern[bytes], tuple[Matcher, Handler]] = {
            MEGATRON: (MEGATRON.match, self._megatron),
            DS_STEP: (DS_STEP.fullmatch, self._ds_step),
            DS_TIMER: (DS_TIMER.fullmatch, self._ds_timer),
            DS_OVERFLOW: (DS_OVERFLOW.fullmatch, self._ds_overflow),
            DS_GRAD: (DS_GRAD.fullmatch, self._ds_grad),
            BAR: (BAR.fullmatch, self._bar),
            HF_DICT: (HF_DICT.fullmatch, self._hf_dict),
        }
        self.pieces = (family[BAR], family[HF_DICT])  # what a `\r` piece may be, in turn
        # the families a line may be, by the first keyword anchor (`prefilter.ANCHORS`) it holds
        self.by_anchor: dict[bytes, tuple[tuple[Matcher, Handler], ...]] = {
            a: tuple(family[rx] for rx in rxs) for a, rxs in BY_ANCHOR.items()
        }

    def usable(self, chunk: bytes) -> bool:
        return not any(w in chunk for w in POISON)

    def blocked(self) -> bool:
        """A reader takes every line while in a block (Megatron's arguments dump, DeepSpeed's JSON
        config, torchrun's failure report, verl's metric line the next may continue): the line goes the
        per-line way."""
        return (
            self.megatron.in_args
            or self.deepspeed.json is not None
            or self.crash.child is not None
            or self.verl.pending is not None
        )

    def line(self, m: re.Match[bytes], no: int, handler: Handler) -> bool:
        """Read the matched line `no`; False when it must go the per-line way (its head holds more
        than launcher prefixes: the text `Line` reads then starts before the family's own)."""
        head = m.group(1)  # "head"
        got = self.heads.get(head, False)
        if got is False:
            got = self._head(head)
        if got is None:
            return False
        ln = BytesLine(m.string, no, *got)
        if got[0] < 0 and ln.rank >= 0 and (ln.rank, ln.host) not in self.told:  # a `[Rank r]` in the text
            self.told.add((ln.rank, ln.host))
            self.seen(ln.rank, ln.host)
        return handler(ln, m)

    def _head(self, head: bytes) -> tuple[int, str | None, int] | None:
        """A head not seen before: its prefixes' rank and host (told to `seen` now: `seen` again, for
        a later line with the same head, would change nothing), None when more than prefixes."""
        if len(self.heads) > _HEADS_KEPT:
            self.heads.clear()
        text = head.decode("ascii")
        rank, host, end = peel(text)
        got = self.heads[head] = (rank, host, end) if not text[end:].strip() else None  # type: ignore[assignment]
        if got is not None and rank >= 0 and (rank, host) not in self.told:
            self.told.add((rank, host))
            self.seen(rank, host)
        return got

    def _megatron(self, ln: Line, m: re.Match[bytes]) -> bool:
        if not self.megatron.fast_iteration(ln, int(m.group("it")), m.string[m.end() :]):
            return False
        self.rec.families.add("megatron")
        return True

    def _ds_step(self, ln: Line, m: re.Match[bytes]) -> bool:
        lr = m.group("lr")
        self.deepspeed._step(
            ln, int(m.group("step")), int(m.group("skipped")), None if lr is None else lr.decode()
        )
        self.rec.families.add("deepspeed")
        return True

    def _ds_timer(self, ln: Line, m: re.Match[bytes]) -> bool:
        ma, mma = m.group("ma", "mma")
        self.deepspeed.timer(
            ln,
            int(m.group("gstep")),
            float(m.group("sps")),
            None if ma is None else float(ma),
            None if mma is None else float(mma),
        )
        self.rec.families.add("deepspeed")
        return True

    def _ds_overflow(self, ln: Line, m: re.Match[bytes]) -> bool:
        rank, before, after = m.group("orank", "before", "after")
        self.deepspeed.skipping(
            ln,
            None if rank is None else int(rank),
            None if before is None else float(before),
            None if after is None else float(after),
        )
        self.rec.families.add("deepspeed")
        return True

    def _ds_grad(self, ln: Line, m: re.Match[bytes]) -> bool:
        self.deepspeed.grad_iter = int(m.group("grad"))
        self.rec.families.add("deepspeed")
        return True

    def _bar(self, ln: Line, m: re.Match[bytes]) -> bool:
        count, total, rate, unit = m.group("count", "total", "rate", "unit")
        try:
            r: float | None = float(rate)
        except ValueError:  # `1.2.3`
            r = None
        self.hf.progress(ln, int(count), int(total), r, unit == b"s/it")
        return True  # the reader reads no more of the piece: no family named (as `HFReader.line`)

    def _hf_dict(self, ln: Line, m: re.Match[bytes]) -> bool:
        if not self.hf.log_dict(ln, m.group("dict").decode("ascii")):
            return False
        self.rec.families.add("hf")
        return True
