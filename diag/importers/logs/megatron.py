"""Megatron-LM, Megatron-DeepSpeed and NeMo lines.

- `iteration 10/ 1000 | consumed samples: 640 | elapsed time per iteration (ms): 812.3 | throughput per
  GPU (TFLOP/s/GPU): 151.2 | learning rate: 1.5E-06 | global batch size: 64 | lm loss: 7.1E+00 |
  loss scale: 65536.0 | grad norm: 3.3 | number of skipped iterations: 1 | number of nan iterations: 0 |`
  (Megatron-DeepSpeed adds `samples per second:`, `tokens per gpu per second (tgs):`, `TFLOPs:`, and
  some forks spell the loss `lm-loss:`). `loss scale: -1.0` is DeepSpeed managing the scale: no scale.
  `number of skipped iterations` counts the iterations since the previous line. Megatron leaves out a
  loss whose mean over the interval is nan (it prints only means > 0): such a line is a nan loss.
  AMD's Primus trainer prints `elapsed time per iteration (ms): 4000.0/3900.0` (this interval / the
  running mean), the same for TFLOP/s and `tokens per GPU (tokens/s/GPU):`: the first is the figure.
- `validation loss at iteration 100 | lm loss value: 5.1E+00 | lm loss PPL: 1.6E+02 |`
- GPT-NeoX (a Megatron fork on DeepSpeed): ` samples/sec: 7.799 | iteration 34/ 10000 | elapsed time per
  iteration (ms): 4103.1 | learning rate: 2.1E-06 | approx flops per GPU: 112.9TFLOPS | lm_loss:
  1.1E+01 | ...` and `validation results at iteration 100 | lm_loss value: 6.9E+00 | lm_loss_ppl value:
  9.9E+02 |`
- `[Rank 0] (after 10 iterations) memory (MB) | allocated: 1.2 | max allocated: 3.4 | reserved: 5.6 |`
  (releases of 2020-21: `after 10 iterations memory (MB) | ...`, no rank, no parentheses)
- the arguments dump between `---- arguments ----` and `---- end of arguments ----`, and
  `using world size: 8, data-parallel size: 2, ..., tensor-model-parallel size: 2, pipeline-model-parallel
  size: 2`
- NeMo (Lightning) progress: `Epoch 0: 50%| 50/100 [..., reduced_train_loss=0.186, global_step=49.00,
  consumed_samples=51200.0, train_step_timing in s=24.00, val_loss=0.21]`
- NeMo 2 (`nemo.lightning` ProgressPrinter): `Training epoch 0, iteration 120/149 | lr: 3e-05 |
  consumed_samples: 121 | global_batch_size: 1 | global_step: 120 | reduced_train_loss: 1.233 |
  train_step_timing in s: 0.03146 | val_loss: 4.106`: `iteration` counts within the epoch, `global_step`
  is the step; the figures are means over the log interval, `val_loss` the last validation's.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any, NamedTuple

from diag import schema
from diag.importers.logs.lines import NUM_BYTES as NUM
from diag.importers.logs.lines import Line, num
from diag.importers.logs.records import MB, Records

_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|(.*)")
_FIELD = re.compile(r"([^|:]+?)\s*:\s*([^|]*?)\s*(?=\||$)")
_VALID = re.compile(r"validation (?:loss|results) at iteration\s+(\d+)\s*(?:on [\w ]+)?\|(.*)")
_MEM = re.compile(r"\(?after\s+(\d+)\s+iterations\)?\s+memory \(MB\)\s*\|(.*)")
_ARG = re.compile(r"^\s*([a-z][a-z0-9_]*)\s\.+\s(.*?)\s*$")
# a line `_ARG` may read, in bytes: a name's last character, a blank (any Unicode one, as UTF-8), a dot;
# inside the dump the other lines without a keyword change nothing (`prefilter` passes them by)
ARG_BYTES = re.compile(rb"[a-z0-9_](?:[\t-\r\x1c-\x20]|[\x80-\xff]{2,3})\.")
_WORLD = re.compile(r"using world size:\s*(\d+)(.*)")
_SIZES = re.compile(r"([a-z-]+?)[ -]size:\s*(\d+)")
_GROUP = re.compile(r"has (data|tensor model|pipeline model|context) parallel group ?: \[([\d, ]*)\]")
_NEMO = re.compile(r"(\w[\w ]*?)=([-+0-9.eE]+|nan|inf)(?=[,\]]|$)")
_FLOP_UNITS = "KMGTPEZ"  # human_readable_flops' prefixes, 1000 apart (T: 1e12, the unit of `tflops`)
_FLOPS = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTPEZ])FLOPS")
_SPS = re.compile(r"samples/sec:\s*(" + NUM.decode() + r")\s*\|\s*$")
_NEMO2 = re.compile(r"\bepoch \d+, iteration \d+/\d+ \|(.*)")

_KEYS = {
    "consumed samples": "consumed_samples",
    "elapsed time per iteration (ms)": "iter_ms",
    "throughput per gpu (tflop/s/gpu)": "tflops",
    "tflops": "tflops",
    "learning rate": "lr",
    "global batch size": "global_batch",
    "lm loss": "loss",
    "lm-loss": "loss",
    "lm_loss": "loss",  # GPT-NeoX
    "approx flops per gpu": "tflops",  # GPT-NeoX: `112.9TFLOPS`, the unit its own (`_flops`)
    "loss": "loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "number of skipped iterations": "skipped_iters",
    "number of nan iterations": "nan_iters",
    "samples per second": "samples_per_sec",
    "tokens per gpu per second (tgs)": "tokens_per_sec_per_gpu",
    "tokens per gpu (tokens/s/gpu)": "tokens_per_sec_per_gpu",
    "tokens per second": "tokens_per_sec",
}
_FIELD_KEYS: dict[str, str] = {}  # a field name as printed -> its column ("": none), remembered
# argument dump -> layout (Megatron-LM and Megatron-DeepSpeed spellings)
_ARGS = {
    "world_size": "world_size",
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "data_parallel_size": "dp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "ds_sequence_parallel_size": "sp",  # Megatron-DeepSpeed's DeepSpeed-Ulysses degree
    "zero_stage": "zero_stage",
    "micro_batch_size": "micro_batch",
    "global_batch_size": "global_batch",
}
# GPT-NeoX's arguments dump (`NeoXArgs.print`): `  model_parallel_size ..... 2..........updated`
_NEOX_SUFFIX = re.compile(r"(?:\.{3,}|(?<=[\]}'\"]))(?:updated|default)$")
_NEOX_ARGS = {
    "global_num_gpus": "world_size",
    "model_parallel_size": "tp",
    "pipe_parallel_size": "pp",
    "train_micro_batch_size_per_gpu": "micro_batch",
    "train_batch_size": "global_batch",
    "gradient_accumulation_steps": "grad_accum",
}
_PADDED = re.compile(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")
_WORLD_KEYS = {
    "data-parallel": "dp",
    "data-parallel-size": "dp",
    "tensor-model-parallel": "tp",
    "pipeline-model-parallel": "pp",
    "context-parallel": "cp",
    "sequence-parallel": "sp",  # Megatron-DeepSpeed: `sequence-parallel size: 2` (Ulysses)
}


class _Shape(NamedTuple):
    """A sequence of `key: number` fields: which values (by place) are which columns; where the loss
    and the skipped counter are (None: not printed), the only figures a record holding every column
    still needs (`MegatronReader.fast_iteration`)."""

    places: tuple[int, ...]
    cols: tuple[str, ...]
    colset: frozenset[str]
    loss: int | None
    skipped: int | None


_SHAPES: dict[tuple[bytes, ...], _Shape | None] = {}
_SHAPES_KEPT = 256
# `key: number |`, split at each `: number |` (a literal `:` first: the engine jumps from colon to colon)
_VALUE = re.compile(rb":[ \t]*(" + NUM + rb")[ \t]*\|")
_KEY = re.compile(rb"[ \t]*[A-Za-z][A-Za-z0-9 ()/_.-]*")


def _shape(keys: tuple[bytes, ...]) -> _Shape | None:
    """Which of the values after `keys` are read, into which columns (the first of each, as `_iteration`
    keeps the first); None when a key is no plain field name (the split then cut elsewhere)."""
    got = _SHAPES.get(keys, False)
    if got is False:
        places, cols = [], []
        for i, k in enumerate(keys):
            if not _KEY.fullmatch(k):
                got = None
                break
            col = _KEYS.get(k.decode("ascii").strip().lower(), "")
            if col and col not in cols:
                places.append(i)
                cols.append(col)
        else:
            at = dict(zip(cols, places))
            got = _Shape(tuple(places), tuple(cols), frozenset(cols), at.get("loss"), at.get("skipped_iters"))
        if len(_SHAPES) >= _SHAPES_KEPT:
            _SHAPES.clear()
        _SHAPES[keys] = got
    return got  # type: ignore[return-value]


def _flops(text: str) -> float | None:
    """TFLOP/s from GPT-NeoX's `human_readable_flops` (`112.9TFLOPS`, `987.6GFLOPS`, `1.2PFLOPS`)."""
    m = _FLOPS.fullmatch(text.strip())
    return float(m.group(1)) * 1000.0 ** (_FLOP_UNITS.index(m.group(2)) - 3) if m else None


class MegatronReader:
    def __init__(self, rec: Records) -> None:
        self.rec = rec
        self.in_args = False
        self.last_iter: int | None = None
        self.log_interval: int | None = None
        self.iters: set[int] = set()  # the iteration lines' numbers

    def line(self, ln: Line) -> bool:
        t = ln.text
        if "iteration" in t:
            if "global_step:" in t and (m := _NEMO2.search(t)):
                return self._nemo2(ln, m.group(1))
            if m := _ITER.search(t):
                sps = _SPS.search(t, 0, m.start()) if m.start() > 12 else None  # GPT-NeoX's, in front
                return self._iteration(ln, int(m.group(1)), m.group(2), num(sps.group(1)) if sps else None)
            if m := _VALID.search(t):
                f = {k.strip().lower(): num(v) for k, v in _FIELD.findall(m.group(2))}
                loss = f.get("lm loss value", f.get("lm_loss value"))  # GPT-NeoX: `lm_loss value`
                ppl = f.get("lm loss ppl", f.get("lm_loss_ppl value"))
                self.rec.step(ln, int(m.group(1)), eval_loss=loss, eval_ppl=ppl)
                return True
            if "memory (MB)" in t and (m := _MEM.search(t)):
                f = {k.strip(): num(v) for k, v in _FIELD.findall(m.group(2))}
                mb = {
                    k: (None if f.get(k) is None else f[k] * MB)
                    for k in (
                        "allocated",
                        "max allocated",  # type: ignore[operator]
                        "reserved",
                    )
                }
                self.rec.add_memory(ln, int(m.group(1)), mb["allocated"], mb["max allocated"], mb["reserved"])
                return True
        if "arguments" in t and "----" in t:
            self.in_args = "end of arguments" not in t
            return True
        if self.in_args:
            if m := _ARG.match(t):
                self._argument(m.group(1), m.group(2))
            return True
        if "using world size:" in t and (m := _WORLD.search(t)):
            sizes = {_WORLD_KEYS[k]: int(v) for k, v in _SIZES.findall(m.group(2)) if k in _WORLD_KEYS}
            self.rec.set_layout(world_size=int(m.group(1)), **sizes)
            return True
        if "parallel group" in t and (m := _GROUP.search(t)):
            key = {"data": "dp", "tensor model": "tp", "pipeline model": "pp", "context": "cp"}[m.group(1)]
            self.rec.set_layout(**{key: len([x for x in m.group(2).split(",") if x.strip()])})
            return True
        if "padded vocab" in t and (m := _PADDED.search(t)):
            self.rec.layout.setdefault("model", {}).setdefault("padded_vocab_size", int(m.group(1)))
            return True
        if "global_step=" in t and "train_step_timing" in t:
            return self._nemo(ln, t)
        return False

    def _iteration(self, ln: Line, it: int, rest: str, samples_per_sec: float | None = None) -> bool:
        f: dict[str, float | None] = {} if samples_per_sec is None else {"samples_per_sec": samples_per_sec}
        for field in rest.split("|"):  # what `_FIELD.findall` reads, without the regex
            if field[:1] == ":":  # no key before the colon: the key starts after it
                field = field.lstrip(":")
            k, colon, v = field.partition(":")
            if not colon:
                continue
            key = _FIELD_KEYS.get(k)
            if key is None:
                key = _FIELD_KEYS[k] = _KEYS.get(k.strip().lower(), "") if len(_FIELD_KEYS) < 4096 else ""
            if key and key not in f:
                try:
                    x: float | None = float(v)  # `num`'s first try, inline: the hot loop of a Megatron log
                except ValueError:
                    x = num(v)
                if x is None and "/" in v:  # `4000.0/3900.0`: this interval's figure / the running mean
                    x = num(v.split("/", 1)[0])
                elif x is None and key == "tflops":
                    x = _flops(v)
                f[key] = x
        self._record(ln, it, {k: v for k, v in f.items() if v is not None})
        return True

    def fast_iteration(self, ln: Line, it: int, fields: bytes) -> bool:
        """An iteration line's fields when all are `key: number` (`fastpath`; False: not all): one
        split at the numbers, the keys' sequence (the same in every line of a run) says which is which."""
        parts = _VALUE.split(fields)
        shape = _shape(tuple(parts[0:-1:2]))
        if shape is None or parts[-1].strip():
            return False
        values = parts[1::2]
        rec = self.rec.steps.get(it)
        if rec is not None and shape.colset <= rec.keys():
            # the step's record holds every figure (another rank printed the line): `_record` would
            # only count the skipped iterations and note the loss
            if shape.skipped is not None:
                self._skips(it, float(values[shape.skipped]))
            self.last_iter = it
            self.rec.progressed(ln, it, rec, None if shape.loss is None else float(values[shape.loss]))
            return True
        self._record(ln, it, {c: float(values[i]) for c, i in zip(shape.cols, shape.places)})
        return True

    def _record(self, ln: Line, it: int, f: dict[str, float]) -> None:
        """The iteration's figures (no None), skipped-iteration counters and record."""
        if f.get("loss_scale", 0) < 0:
            del f["loss_scale"]  # -1: DeepSpeed manages the scale, Megatron does not know it
        skipped = f.get("skipped_iters")
        if skipped is not None:
            self._skips(it, skipped)
        self.last_iter = it
        self.iters.add(it)
        self.rec.merge(ln, it, f)

    def flush(self) -> None:
        """Megatron prints a loss only where its mean over the interval is > 0: an iteration no line
        printed the loss of, after iterations that did (or with a nan grad norm), whose interval
        applied at least one iteration, had a nan/inf loss. An interval whose iterations were all
        skipped (fp16 calibration) prints no loss either: no sign. Judged once every line is read:
        in a log of several ranks, one rank's line may print what another's leaves out."""
        printed, prev = False, None
        for it in sorted(self.iters):
            rec = self.rec.steps[it]
            loss, skipped, norm = rec.get("loss"), rec.get("skipped_iters"), rec.get("grad_norm")
            n = it - prev if prev is not None else self.log_interval
            prev = it
            if loss is not None:
                printed = True
            elif skipped is not None and (printed or (norm is not None and norm != norm)):
                if skipped == 0 or (n is not None and skipped < n):
                    rec["loss"], rec["loss_nonfinite"] = math.nan, True

    def _skips(self, it: int, skipped: float) -> None:
        """The skipped-iteration counter of iteration `it`'s line: the iterations since the last line."""
        if self.last_iter is not None and self.last_iter < it:
            first = self.last_iter + 1
        else:  # the first line: it covers the `log_interval` iterations before it
            first = max(1, it - (self.log_interval or int(skipped) or 1) + 1)
        self.rec.skip_counts.append((first, it, int(skipped)))

    def _argument(self, key: str, value: str) -> None:
        if m := _NEOX_SUFFIX.search(value):  # GPT-NeoX's dump: `1...........updated`
            value = value[: m.start()]
            self.rec.families.add("neox")
        if "neox" in self.rec.families:
            # its arguments are NeoX's YAML keys, no Megatron flags: not `args` (framework detection)
            self._neox(key, value)
            return
        self.rec.args.setdefault(key, value)
        if key in schema.MEGATRON_MODEL_ARGS:
            self.rec.layout.setdefault("model", {}).setdefault(key, _arg_value(value))
        if key == "log_interval":
            self.log_interval = int(num(value) or 0) or None
        elif key in _ARGS:
            v = num(value)
            if v is not None and v == v:
                self.rec.set_layout(**{_ARGS[key]: int(v)})
        elif key in ("fp16", "bf16") and value == "True":
            self.rec.set_layout(dtype=key)

    def _neox(self, key: str, value: str) -> None:
        """GPT-NeoX's arguments: the layout, and the model's shape (its names are Megatron's)."""
        if key in schema.MEGATRON_MODEL_ARGS and (v := num(value)) is not None and math.isfinite(v):
            self.rec.layout.setdefault("model", {}).setdefault(key, int(v) if v == int(v) else v)
        if key == "precision":
            self.rec.set_layout(dtype={"fp16": "fp16", "bfloat16": "bf16", "fp32": "fp32"}.get(value))
        elif key == "zero_optimization" and (m := re.search(r"'stage': (\d)", value)):
            self.rec.set_layout(zero_stage=int(m.group(1)))
        elif key in _NEOX_ARGS and (v := num(value)) is not None and v == v:
            self.rec.set_layout(**{_NEOX_ARGS[key]: max(int(v), 1)})  # pipe_parallel_size 0: no pipeline

    def _nemo2(self, ln: Line, fields: str) -> bool:
        return self._nemo_step(
            ln, {k.strip(): num(v) for k, _, v in (x.partition(":") for x in fields.split("|"))}
        )

    def _nemo(self, ln: Line, t: str) -> bool:
        return self._nemo_step(ln, {k.strip(): num(v) for k, v in _NEMO.findall(t)})

    def _nemo_step(self, ln: Line, f: dict[str, float | None]) -> bool:
        """A NeMo progress line's figures (NeMo 1's `key=value` bar, NeMo 2's `key: value |` line)."""
        step = f.get("global_step")
        if step is None or step != step:
            return False
        sec = f.get("train_step_timing in s")
        self.rec.step(
            ln,
            int(step),
            loss=f.get("reduced_train_loss"),
            lr=f.get("lr"),
            consumed_samples=f.get("consumed_samples"),
            global_batch=f.get("global_batch_size"),
            eval_loss=f.get("val_loss"),
            iter_ms=None if sec is None else sec * 1e3,
        )
        return True


def _arg_value(value: str) -> Any:
    """A Megatron argument as its Python value, as the agent reads it from the job's args (the
    dump prints repr(value)): 64, 0.1, True, None, [1]; text where it is none of those."""
    v = num(value)
    if v is not None and math.isfinite(v):
        return v if v != int(v) else int(v)
    if value in _CONSTANTS:
        return _CONSTANTS[value]
    if value[:1] in "[(" and len(value) < 200:
        try:
            out = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return value
        return list(out) if isinstance(out, tuple) else out
    return value


_CONSTANTS = {"True": True, "False": False, "None": None}
