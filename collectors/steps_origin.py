"""The program's own iteration number for a plain torch loop (no DeepSpeed or Megatron counter).

An agent attached mid-run must number steps as the program does, the same on every rank; a tally
from the moment of attach differs from the program's printed iteration and between ranks attached at
different moments (issue 17: 62 below the printed iteration, and the two ranks one apart).

Sources, in order (`origin`, written as the `step_origin` meta):
- `loop:NAME`: the loop's own counter, an int local of the code that called `optimizer.step()` (the
  nearest frames outside torch and diag) named like an iteration (`LOOP_NAMES`). It is what the
  program prints (nanoGPT's `iter_num`, a `for step in range(...)`), but a name alone proves nothing:
  it is trusted only while it advances by exactly one per optimizer step (a micro-step counter under
  gradient accumulation advances by k, an epoch-local `step` restarts) and dropped for good otherwise.
- `optimizer`: the optimizer's own count of updates taken, the per-parameter `state[p]["step"]`
  (Adam, AdamW, RMSprop, Adagrad, ...), which survives a checkpoint resume. It is 1-based after the
  first update, like DeepSpeed's `global_steps`. Read once, as the max over parameters (a parameter
  without a gradient in some steps lags), then counted on; a count held on an accelerator is not read
  (reading it would synchronize the device).
- `attach`: neither exists (SGD without momentum keeps no count): steps are counted from 0 at attach.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

LOOP_NAMES = ("iteration", "iter_num", "global_step", "train_step", "step", "iters", "iter", "itr", "it")
FRAMES = 3  # caller frames outside torch and diag searched for a loop counter


def _skipped_dirs() -> tuple[str, ...]:
    torch = sys.modules.get("torch")
    here = os.path.dirname(os.path.abspath(__file__))
    diag = sys.modules.get("diag")
    dirs = [here + os.sep]
    if diag is not None and getattr(diag, "__file__", None):
        dirs.append(os.path.dirname(os.path.abspath(diag.__file__ or "")) + os.sep)
    if torch is not None and getattr(torch, "__file__", None):
        dirs.append(os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep)
    return tuple(dirs)


def loop_counters(frame: FrameType | None, skip: tuple[str, ...]) -> dict[str, int]:
    """Int locals named like an iteration in the nearest `FRAMES` frames outside `skip` (nearest
    frame first; a name seen in a nearer frame hides the same name further out)."""
    found: dict[str, int] = {}
    seen = 0
    while frame is not None and seen < FRAMES:
        if not frame.f_code.co_filename.startswith(skip):
            seen += 1
            local = frame.f_locals
            for name in LOOP_NAMES:
                value = local.get(name)
                if name not in found and type(value) is int:
                    found[name] = value
        frame = frame.f_back
    return found


def optimizer_count(optimizer: Any) -> int | None:
    """The optimizer's updates taken so far (max of its parameters' `step`), or None."""
    best: int | None = None
    for state in getattr(optimizer, "state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if step is None:
            continue
        if hasattr(step, "device"):
            if step.device.type != "cpu" or step.numel() != 1:
                return None  # reading it would synchronize the accelerator
            step = step.item()
        if isinstance(step, (int, float)) and step >= 0:
            best = max(best or 0, int(step))
    return best


class ProgramCounter:
    """Numbers torch-loop boundaries by the program's own counter (see the module doc).

    The source is chosen at the first boundary after attach and never changes back: a loop counter
    is taken there when it agrees with the optimizer's count (equal, or one less: a 0-based loop), or
    provisionally when the optimizer keeps no count; it is dropped at the first step it does not
    advance by one, and the numbers then continue from the optimizer's count, else by one a step."""

    def __init__(self) -> None:
        self.skip = _skipped_dirs()
        self.tally = -1  # boundaries seen since attach, less one
        self.loop: str | None = None  # the loop counter in use
        self.last = 0  # its value at the previous boundary
        self.offset = 0  # number minus tally, once the loop counter is not in use
        self.origin = "attach"

    def number(self, optimizer: Any, frame: FrameType | None) -> tuple[int, str]:
        """The number of the step that just ended (after `optimizer.step()`), and its origin."""
        self.tally += 1
        if self.tally == 0:
            found = loop_counters(frame, self.skip)
            count = optimizer_count(optimizer)
            for name in LOOP_NAMES:
                if name in found and (count is None or found[name] in (count - 1, count)):
                    self.loop, self.last = name, found[name]
                    return self.last, f"loop:{name}"
            self._from_optimizer(count, 0)
        elif self.loop is not None:
            value = loop_counters(frame, self.skip).get(self.loop)
            if value == self.last + 1:
                self.last = value
                return value, f"loop:{self.loop}"
            self.loop = None
            self._from_optimizer(optimizer_count(optimizer), self.last + 1)
        return self.tally + self.offset, self.origin

    def _from_optimizer(self, count: int | None, otherwise: int) -> None:
        """Number on from the optimizer's count, else from `otherwise` at this boundary."""
        self.origin = "optimizer" if count is not None else "attach"
        self.offset = (count if count is not None else otherwise) - self.tally
