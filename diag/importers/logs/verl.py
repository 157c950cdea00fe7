"""verl (and its forks: TinyZero, siiRL, ...) RL trainer lines, usually behind Ray's actor prefix
(`(TaskRunner pid=..)`, `(main_task pid=..)`: `lines` peels it).

- the console logger's metrics line per step: `step:12 - actor/pg_loss:0.018 - actor/grad_norm:1.000 -
  actor/lr:0.000 - training/epoch:1.000 - timing_s/step:8.991 - perf/time_per_step:8.991 -
  perf/throughput:3330.450 - ...` (`perf/throughput` is tokens/s per GPU: total tokens / (step time x
  GPUs); `perf/throughput_all_gpus` the job's).
A policy-gradient loss is no language-model loss (it is centred on 0 and changes sign), so it is not
the step's `loss` (a spike rule would misread it); a nan/inf policy or value loss still marks the step
(`loss_nonfinite`).
A metric line hard-wrapped by a terminal or a paste (pieces of the terminal's width, the ones after the
first without a prefix) is read whole where the pieces' continuation is unambiguous (`_continues`).
"""

from __future__ import annotations

import math
import re

from diag.importers.logs.lines import _NUM, Line, num
from diag.importers.logs.records import Records
from diag.importers.logs.verl_config import TrainerConfig

_STEP = re.compile(r"\s*step:(\d+) - (.*)")
_SECONDS = {"timing_s/step": "iter_ms", "perf/time_per_step": "iter_ms"}  # seconds -> ms
_KEYS = {
    "actor/grad_norm": "grad_norm",
    "actor/lr": "lr",
    "training/epoch": "epoch",
    "perf/throughput": "tokens_per_sec_per_gpu",
    "perf/throughput_all_gpus": "tokens_per_sec",
}
_LOSSES = ("actor/pg_loss", "critic/vf_loss")


class VerlReader:
    """Each metric line is held (`pending`) until the next line says whether it continues it: a
    terminal or a paste hard-wraps a long line into pieces of its width, and the pieces after the first
    carry no prefix. A next line is a continuation only where that is unambiguous (`_continues`)."""

    def __init__(self, rec: Records) -> None:
        self.rec = rec
        self.pending: tuple[Line, int, list[str]] | None = None  # (first line, its step, its pieces)
        self.config = TrainerConfig(rec)

    def line(self, ln: Line) -> bool:
        t = ln.text
        if "step:" not in t or (m := _STEP.match(t)) is None:
            return ("'trainer': {" in t or self.config.depth > 0) and self.config.line(t)
        self.flush()
        self.pending = (ln, int(m.group(1)), [m.group(2)])
        return True

    def continues(self, ln: Line) -> bool:
        """`ln` read as the next piece of the pending metric line; False (the pending line then read
        as it is) when it is none."""
        assert self.pending is not None
        first, _, pieces = self.pending
        if not _continues(first, pieces, ln):
            self.flush()
            return False
        pieces.append(ln.raw)
        return True

    def flush(self) -> None:
        """Read the pending metric line, whole."""
        if self.pending is None:
            return
        ln, step, pieces = self.pending
        self.pending = None
        while len(pieces) > 1 and not _FIELD.fullmatch("".join(pieces).rsplit(" - ", 1)[-1]):
            pieces.pop()  # the metric line ends with a whole field: pieces that leave one cut are none
        self.rec.step(ln, step, **_figures("".join(pieces)))


def _figures(rest: str) -> dict[str, float | bool | None]:
    f: dict[str, float | bool | None] = {}
    for field in rest.split(" - "):
        key, _, value = field.partition(":")
        key = key.strip()
        col = _SECONDS.get(key)
        if col is not None:
            sec = num(value)
            f.setdefault(col, None if sec is None else sec * 1e3)
        elif (col := _KEYS.get(key)) is not None:
            f.setdefault(col, num(value))
        elif key in _LOSSES and (v := num(value)) is not None and not math.isfinite(v):
            f["loss_nonfinite"] = True
    return f


_ANSI = re.compile(r"\x1b\[[\d;]*m")
_FIELD = re.compile(r"[\w/@.\-]+:(?:" + _NUM + r")\s*")
_PARTIAL = re.compile(r"[\w/@.\-]*(?::[-+]?[\w.+\-]*)?\s*-?\s*")  # a field a next piece may complete
WRAP_MIN = 80  # a terminal narrower than this wraps no metric line


def _continues(first: Line, pieces: list[str], ln: Line) -> bool:
    """A hard-wrapped piece: no prefix of its own, no wider than the first line's display width W (the
    pieces before it exactly W), and needed: the text so far ends inside a field (a key without its
    `:`, a `:` without its value, a dangling `-`) or the piece starts inside one (a `-` separator, or
    a fragment with no `:`: a value's digits); the joined text must then be `key:number` fields, the
    last one possibly cut (a next piece may complete it). A piece that starts with a field of its own
    after a complete one continues nothing: it may as well be a line of its own."""
    raw = ln.raw
    if not raw or raw != ln.text or ln.rank >= 0 or (raw[0].isspace() and not raw.startswith(" -")):
        return False
    width = len(_ANSI.sub("", first.raw))
    if width < WRAP_MIN or len(raw) > width or any(len(p) != width for p in pieces[1:]):
        return False
    text = "".join(pieces)
    last = text.rsplit(" - ", 1)[-1]
    head = raw.split(" - ", 1)[0]
    cut_before = ":" not in last or last.endswith(":") or text.endswith(("-", " "))
    cut_after = raw.startswith(("-", " -")) or ":" not in head
    if not (cut_before or cut_after):
        return False
    fields = (text + raw).split(" - ")
    return all(_FIELD.fullmatch(f) for f in fields[:-1]) and bool(_PARTIAL.fullmatch(fields[-1]))
