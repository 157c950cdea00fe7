"""nanoGPT's training loop (karpathy/nanoGPT `train.py`, and the many loops copied from it):
- `iter 120: loss 3.4021, time 505.91ms, mfu 21.37%` after each optimizer step: the loss of the
  step's last micro-batch (times the accumulation steps, as nanoGPT prints it) and the wall time
  since the previous line, in ms; the MFU is nanoGPT's own estimate (-100% before its 5th step) and
  is not read: diag's MFU comes from counted FLOPs and the device's peak;
- `step 2000: train loss 3.1215, val loss 3.3049` at each evaluation, before that iteration trains:
  the validation loss is the step's `eval_loss`.
Both carry nanoGPT's `iter_num`, the number diag's steps collector reads from the loop (`loop:iter_num`),
so a trace and the log of one run line up step for step.
"""

from __future__ import annotations

import re

from diag.importers.logs.lines import _NUM, Line, num
from diag.importers.logs.records import Records

_ITER = re.compile(rf"iter (\d+): loss ({_NUM}), time ({_NUM})ms, mfu ", re.IGNORECASE)
_EVAL = re.compile(rf"step (\d+): train loss ({_NUM}), val loss ({_NUM})", re.IGNORECASE)


class NanoGPTReader:
    def __init__(self, rec: Records) -> None:
        self.rec = rec

    def line(self, ln: Line) -> bool:
        t = ln.text
        if "ms, mfu " in t and (m := _ITER.search(t)) is not None:
            self.rec.step(ln, int(m.group(1)), loss=num(m.group(2)), iter_ms=num(m.group(3)))
            return True
        if ", val loss " in t and (m := _EVAL.search(t)) is not None:
            self.rec.step(ln, int(m.group(1)), eval_loss=num(m.group(3)))
            return True
        return False
