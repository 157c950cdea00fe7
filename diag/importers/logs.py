"""Import DeepSpeed / Megatron(-DeepSpeed) training logs into `log_step`, `overflow` and `memory`
frames. Recognized lines (any prefix, e.g. timestamps or `[Rank N]`):

- Megatron: `iteration 10/ 1000 | ... elapsed time per iteration (ms): 812.3 | throughput per GPU
  (TFLOP/s/GPU): 151.2 | lm loss: 7.1E+00 | loss scale: 65536.0 | number of skipped iterations: 1 |`
  (Megatron-DeepSpeed spells throughput `TFLOPs: 151.2`).
- DeepSpeed: `OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768`,
  `[Rank 0] step=10, skipped=2, lr=[...]`.
- Megatron memory report: `[Rank 0] (after 10 iterations) memory (MB) | allocated: 1.2 | max
  allocated: 3.4 | reserved: 5.6 | max reserved: 5.6`.
Iteration lines carry rank -1 (the job: Megatron prints them on one rank only). OVERFLOW lines name
no step: each is given the step after the last logged iteration (or after the previous overflow).
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from diag import schema
from diag.importers.errors import ImportProblem
from diag.importers.jsonfile import read_bytes

_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|(.*)")
_FIELD = re.compile(r"\s*([^|:]+?)\s*:\s*([-+0-9.eEnaif]+)\s*(?=\||$)")
_OVERFLOW = re.compile(r"OVERFLOW!\s*Rank\s+(\d+)\s+Skipping step\.?(?:\s*Attempted loss scale:\s*"
                       r"([0-9.eE+]+),\s*reducing to\s*([0-9.eE+]+))?")
_DS_STEP = re.compile(r"\[Rank\s+(\d+)\]\s+step=(\d+),\s*skipped=(\d+)")
_MEM = re.compile(r"\[Rank\s+(\d+)\]\s+\(after\s+(\d+)\s+iterations\)\s+memory \(MB\)\s*\|(.*)")
_KEYS = {"elapsed time per iteration (ms)": "iter_ms", "throughput per GPU (TFLOP/s/GPU)": "tflops",
         "TFLOPs": "tflops", "lm loss": "loss", "loss": "loss", "loss scale": "loss_scale",
         "grad norm": "grad_norm", "number of skipped iterations": "skipped_iters",
         "number of nan iterations": "nan_iters", "samples per second": "samples_per_sec",
         "learning rate": "lr", "global batch size": "global_batch"}
LOG_STEP_COLUMNS = ("rank", "step", *dict.fromkeys(_KEYS.values()))
MARKERS = (b"iteration", b"OVERFLOW!", b"memory (MB)", b"step=", b"[Rank")


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _fields(text: str) -> dict[str, float | None]:
    return {_KEYS[m.group(1)]: _num(m.group(2)) for m in _FIELD.finditer(text) if m.group(1) in _KEYS}


class _Parser:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.overflow: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.last_iter = 0
        self.last_overflow = 0

    def line(self, text: str) -> None:
        if m := _ITER.search(text):
            self.last_iter = int(m.group(1))
            self.steps.append({"rank": -1, "step": self.last_iter, **_fields(m.group(2))})
        elif m := _OVERFLOW.search(text):
            # the line has no step number: the step after the last one logged, one per overflow line
            self.last_overflow = max(self.last_iter + 1, self.last_overflow + 1)
            self.overflow.append({"rank": int(m.group(1)), "step": self.last_overflow, "ts": None,
                                  "overflow": True, "scale_before": _num(m.group(2) or ""),
                                  "scale_after": _num(m.group(3) or ""), "skipped_steps": None,
                                  "source": "log"})
        elif m := _DS_STEP.search(text):
            self.last_iter = int(m.group(2))
            self.steps.append({"rank": int(m.group(1)), "step": self.last_iter,
                               "skipped_iters": float(m.group(3))})
        elif m := _MEM.search(text):
            f = {k.strip(): _num(v) for k, v in re.findall(r"([a-z ]+):\s*([0-9.eE+]+)", m.group(3))}
            mb = 1 << 20
            self.memory.append({"rank": int(m.group(1)), "step": int(m.group(2)), "ts": None,
                                "device": "log", "allocated": (f.get("allocated") or 0) * mb,
                                "reserved": (f.get("reserved") or 0) * mb,
                                "peak": (f.get("max allocated") or 0) * mb, "capacity": None,
                                "rss": None, "module": None})


def import_log(path: str) -> tuple[list[int], dict[str, pd.DataFrame]]:
    """(ranks named in the log, frames by kind); `ImportProblem` when no known line is found."""
    data = read_bytes(path)
    if b"\x00" in data[:4096]:
        raise ImportProblem("binary file, not a training log")
    p = _Parser()
    for text in data.decode("utf-8", errors="replace").splitlines():
        p.line(text)
    if not (p.steps or p.overflow or p.memory):
        raise ImportProblem("no DeepSpeed/Megatron iteration, overflow or memory lines found")
    frames = {"log_step": pd.DataFrame(p.steps, columns=list(LOG_STEP_COLUMNS)),
              schema.OVERFLOW: pd.DataFrame(p.overflow, columns=["rank", *schema.FIELDS[schema.OVERFLOW]]),
              schema.MEMORY: pd.DataFrame(p.memory, columns=["rank", *schema.FIELDS[schema.MEMORY]])}
    frames = {k: v for k, v in frames.items() if not v.empty}
    ranks = sorted({int(r) for df in frames.values() for r in df["rank"] if r >= 0})
    return ranks, frames
