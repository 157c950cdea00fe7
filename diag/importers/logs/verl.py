"""verl (and its forks: TinyZero, siiRL, ...) RL trainer lines, usually behind Ray's actor prefix
(`(TaskRunner pid=..)`, `(main_task pid=..)`: `lines` peels it).

- the console logger's metrics line per step: `step:12 - actor/pg_loss:0.018 - actor/grad_norm:1.000 -
  actor/lr:0.000 - training/epoch:1.000 - timing_s/step:8.991 - perf/time_per_step:8.991 -
  perf/throughput:3330.450 - ...` (`perf/throughput` is tokens/s per GPU: total tokens / (step time x
  GPUs); `perf/throughput_all_gpus` the job's).
A policy-gradient loss is no language-model loss (it is centred on 0 and changes sign), so it is not
the step's `loss` (a spike rule would misread it); a nan/inf policy or value loss still marks the step
(`loss_nonfinite`).
"""

from __future__ import annotations

import math
import re

from diag.importers.logs.lines import Line, num
from diag.importers.logs.records import Records

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
    def __init__(self, rec: Records) -> None:
        self.rec = rec

    def line(self, ln: Line) -> bool:
        t = ln.text
        if "step:" not in t or (m := _STEP.match(t)) is None:
            return False
        f: dict[str, float | bool | None] = {}
        for field in m.group(2).split(" - "):
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
        self.rec.step(ln, int(m.group(1)), **f)
        return True
