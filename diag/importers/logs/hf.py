"""Hugging Face Trainer (+ DeepSpeed) lines.

- log dicts `{'loss': 0.86, 'grad_norm': 1.2, 'learning_rate': 6.6e-05, 'epoch': 0.11}` (recent releases
  print the values as strings: `{'loss': '65.88', ...}`); eval dicts `{'eval_loss': ...}`; the run
  summary `{'train_runtime': 85.46, 'train_samples_per_second': 11.7, 'train_steps_per_second': 1.17,
  'train_loss': 0.50, 'epoch': 1.0}` (with `include_num_input_tokens_seen` every step's dict also holds
  `train_runtime`, the seconds trained so far: its step time is the time between two of them). The dicts
  name no step: the step is the training progress bar's
  count just before (`100/200 [03:38<03:38,  2.18s/it]`, whose rate gives the step time: `tqdm_times`),
  else their order.
  The training bar (its total is `Total optimization steps`; where that block is not printed,
  transformers 5 at its default verbosity, the bar a loss dict or the run summary is written under, or
  the only bar) is a step record of its own at each count it shows: a run logging no dicts
  (`logging_steps` > its steps, the default 500) still has its steps.
- a skipped step: the Trainer logs the optimizer's grad norm of the step it logs, and under fp16 loss
  scaling (DeepSpeed's ZeRO and fp16 optimizers, torch AMP) a step skipped for overflow has an `inf`
  (or `nan`) norm: `{'loss': '5.398', 'grad_norm': 'inf', 'learning_rate': '0', ...}`. Nothing else in
  the log says so (HF sets DeepSpeed's `steps_per_print` to inf, and its `OVERFLOW!` lines need its
  logger at INFO). A non-finite norm whose update was applied makes the weights non-finite, so every
  later loss is nan: the step counts as skipped once a later logged loss is finite. A norm the run's
  last dicts print stays unknown.
- `***** Running training *****` block: `Instantaneous batch size per device = 8`, `Total train batch
  size (w. parallel, distributed & accumulation) = 64`, `Gradient Accumulation steps = 1`,
  `Total optimization steps = 100`.
- every rank of a torchrun job may print the dicts (transformers 5 under the deepspeed launcher and
  torchrun): two ranks writing at once leave `{'loss': ...}{'loss': ...}` on one line, each a dict.
"""

from __future__ import annotations

import ast
import math
import re

from diag.importers.logs.lines import Line, num
from diag.importers.logs.records import Overflow, Records
from diag.importers.logs.tqdm_times import BarTimes

_BAR = re.compile(r"\|\s*(\d+)/(\d+)\s*\[[^\]]*?,\s*([\d.]+)(s/it|it/s)")
_DICT = re.compile(r"\{'(?:loss|eval_loss|train_runtime|train_loss)'.*\}")
_BLOCK = re.compile(
    r"(?:^|>>)\s*(Instantaneous batch size per device|"
    r"Total train batch size \(w\. parallel, distributed & accumulation\)|"
    r"Gradient Accumulation steps|Total optimization steps)\s*=\s*([\d,]+)"
)
MAX_UNPLACED = 100_000  # displays of one bar kept until it is known to be training's
_ONE_DICT = re.compile(r"(?<=\})(?=\{')")  # between two dicts printed on one line
_BARE_NONFINITE = re.compile(r"(?<=: )(-?(?:nan|inf))(?=[,}])")  # `{'loss': nan, ...}`: repr of a float nan
# a flat dict of numbers and plain strings, as the Trainer prints it: read without `ast` (which compiles
# each line); anything else (other spacing, escapes, nested values) goes to `ast.literal_eval`
_FLOAT = r"[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|[1-9]\d*|0)"
_PAIR = r"'([^'\\\n]*)': (" + _FLOAT + r"|'[^'\\\n]*')"
_FLAT = re.compile(r"\{" + _PAIR + r"(?:, " + _PAIR + r")*\}")
_PAIRS = re.compile(_PAIR)
_RUN = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")


class HFReader:
    def __init__(self, rec: Records) -> None:
        self.rec = rec
        self.total: int | None = None  # Total optimization steps: which progress bar is training's
        self.bar: dict[int, tuple[int, float | None]] = {}  # bar total -> (count, ms per step)
        self.times: dict[int, BarTimes] = {}  # bar total -> its step times (`tqdm_times`)
        self.last_total: int | None = None  # the total of the bar displayed last
        # displays of bars before the training bar is known: (line, count, ms, revised) per total
        self.unplaced: dict[int, list[tuple[Line, int, float | None, float | None]]] = {}
        self.dicts = 0
        self.runtime: tuple[int, float] | None = None  # (step, train_runtime) of the last step log
        self.nonfinite_norm: set[int] = set()  # steps logged with an inf/nan grad norm, not yet judged

    def line(self, ln: Line) -> bool:
        t = ln.text
        if "it]" in t or "it/s]" in t:
            if m := _BAR.search(t):
                self.progress(ln, int(m.group(1)), int(m.group(2)), num(m.group(3)), m.group(4) == "s/it")
                t = t[m.end() :]
        if "{'" in t and (m := _DICT.search(t)):
            text = m.group(0)
            if "}{" in text and _figures(text) is None:  # two ranks' dicts written at once, no newline
                return any([self.log_dict(ln, piece) for piece in _ONE_DICT.split(text)])
            return self.log_dict(ln, text)
        if " = " in t and (m := _BLOCK.search(t)):
            v = int(m.group(2).replace(",", ""))
            key = m.group(1)
            if key.startswith("Instantaneous"):
                self.rec.set_layout(micro_batch=v)
            elif key.startswith("Total train batch"):
                self.rec.set_layout(global_batch=v)
            elif key.startswith("Gradient"):
                self.rec.set_layout(grad_accum=v)
            else:
                self.training_bar(v)
            return True
        return False

    def progress(self, ln: Line, count: int, total: int, rate: float | None, per_step: bool) -> None:
        """A progress bar's count of its total at `rate` (seconds per step when `per_step`, else steps
        per second)."""
        sec = None if not rate else (rate if per_step else 1.0 / rate)
        times = self.times.get(total)
        if times is None:
            times = self.times[total] = BarTimes(total)
        ms = None if sec is None else times.step_ms(count, sec)
        self.bar[total] = (count, ms)
        self.last_total = total
        if count <= 0:
            return
        if total == self.total:  # the training bar: a step record per step it shows
            self._step_time(ln, count, ms, times.revised)
        elif self.total is None and len(self.unplaced.get(total, ())) < MAX_UNPLACED:
            self.unplaced.setdefault(total, []).append((ln, count, ms, times.revised))

    def _step_time(self, ln: Line, count: int, ms: float | None, revised: float | None) -> None:
        rec = self.rec.one(ln, count, "iter_ms", ms)
        if revised is not None and rec.get("iter_ms") == revised:
            rec["iter_ms"] = ms  # a second bar's display of the count: the step's time revised

    def training_bar(self, total: int | None) -> None:
        """`total` is the training bar's (None: not known yet): its displays so far become steps."""
        if total is None or self.total is not None:
            return
        self.total = total
        for ln, count, ms, revised in self.unplaced.pop(total, []):
            self._step_time(ln, count, ms, revised)
        self.unplaced.clear()

    def flush(self) -> None:
        """At the log's end, a training bar never named (no start-up block, no dict): the one bar
        total shown, if only one was and no other line gave a step (a data-preparation bar in a
        Megatron log is no training bar)."""
        if self.total is None and len(self.unplaced) == 1 and not self.rec.steps:
            self.training_bar(next(iter(self.unplaced)))

    def _train_bar(self) -> tuple[int, float | None] | None:
        if self.total is not None and self.total in self.bar:
            return self.bar[self.total]
        return self.bar[max(self.bar)] if self.bar else None

    def log_dict(self, ln: Line, text: str) -> bool:
        """A log dict (`text`: the dict); False when it is none."""
        f = _figures(_BARE_NONFINITE.sub(r"'\1'", text))
        if f is None:
            return False
        if "loss" in f or "train_runtime" in f:  # written under the training bar, not an eval bar
            self.training_bar(self.last_total)
        if "train_runtime" in f and "loss" not in f:  # the run's summary (a step's log has its loss)
            self.rec.run.update({k: f[k] for k in _RUN if f.get(k) is not None})  # type: ignore[misc]
            return True
        bar = self._train_bar()
        if "loss" in f:
            self.dicts += 1
        step = bar[0] if bar else max(self.dicts, 1)
        rec = self.rec.step(
            ln,
            step,
            loss=f.get("loss"),
            lr=f.get("learning_rate"),
            grad_norm=f.get("grad_norm"),
            epoch=f.get("epoch"),
            eval_loss=f.get("eval_loss"),
            iter_ms=bar[1] if bar and "loss" in f else None,
        )
        self._skipped(step, f.get("loss"), f.get("grad_norm"))
        runtime = f.get("train_runtime")  # the seconds trained so far (`include_num_input_tokens_seen`)
        if runtime is not None and "loss" in f:
            if self.runtime is not None and step > self.runtime[0] and runtime >= self.runtime[1]:
                # the time between two logs over the steps between them: the bar's rate is a moving
                # average, which carries the first step's start-up into the next ones
                rec["iter_ms"] = (runtime - self.runtime[1]) / (step - self.runtime[0]) * 1e3
            self.runtime = (step, runtime)
        return True

    def _skipped(self, step: int, loss: float | None, norm: float | None) -> None:
        """Note a step logged with a non-finite grad norm; a finite loss logged at a later step makes
        the noted steps skipped ones: each its own skip count of one (exact: the norm is that step's)."""
        if loss is not None and math.isfinite(loss):
            for s in sorted(x for x in self.nonfinite_norm if x < step):
                self.nonfinite_norm.discard(s)
                self.rec.skip_counts.append((s, s, 1))  # with DeepSpeed's own lines, counted once
                self.rec.overflows.append(Overflow(s, None, None, -1, None, "log_grad_norm"))
                self.rec.steps[s]["skipped_iters"] = 1
        if norm is not None and not math.isfinite(norm):
            self.nonfinite_norm.add(step)


def _figures(text: str) -> dict[str, float | None] | None:
    """The dict's numbers by key (a string that is no number: None); None when it is no dict."""
    if _FLAT.fullmatch(text):
        return {k: num(v) for k, v in _PAIRS.findall(text)}
    try:
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    return {k: num(str(v)) for k, v in d.items() if isinstance(v, (int, float, str))}
