"""torchtitan's metrics line (`MetricsProcessor.log`, every `metrics.log_freq` steps and at step 1):
- `step: 14  loss:  3.2440  grad_norm:  0.8319  memory:  9.46GiB(64.99%)  tps: 7,282  tflops: 0.52
  mfu: 0.17%`; releases of 2024 print no grad_norm nor tflops and call tps `wps`. Each field may carry
  an ANSI colour code (torchtitan colours them unless `metrics.disable_color_printing`).
  `tps` is tokens per second per device, `tflops` per device; `memory` is the device's peak reserved
  memory since the previous line, with its share of the capacity; `loss` the global mean.
  The line prints no step time: it is the time between two lines' timestamps over the steps between
  them, as torchtitan's own timer measures its tps.
- `validate step: 100  loss:  2.9120  memory: ...  tps: ...`: the step's validation loss. torchtitan
  restarts its timer after a validation, and so does the step time: the validation's time is no step's.
Every rank logs the same line (no rank prefix unless torchrun's `--tee`): the step counts once.
- the layout, from the device mesh it builds: `Building 2-D device mesh with ['dp_shard', 'tp'], [4, 2]`
  (2024-25; `dp` in the first releases), `Building device mesh with parallelism: pp=1, dp_replicate=1,
  dp_shard=8, cp=1, tp=1, ep=1` (2026): TP, PP, CP, DP (replicas x FSDP shards) and their product, the
  world size.
Forks that print their evaluation in the same shape (`context: val  step: 3  loss: ...`) number it by
the evaluation's own batches: not read.
"""

from __future__ import annotations

import re

from diag.importers.logs.lines import _NUM, Line, num
from diag.importers.logs.records import GB, Records

_ANSI = re.compile(r"\x1b\[[\d;]*m")
_LINE = re.compile(
    rf"(validate )?step:\s*(\d+)\s+loss:\s*({_NUM})\s+(?:grad_norm:\s*({_NUM})\s+)?"
    rf"memory:\s*({_NUM})GiB\(({_NUM})%\)\s+[tw]ps:\s*([\d,]+)(?:\s+tflops:\s*([\d,.]+))?",
    re.IGNORECASE,
)


_MESH = re.compile(
    r"Building (?:\d-D device mesh with \[([^\]]*)\], \[([\d, ]*)\]|device mesh with parallelism: (.*))"
)
_DEGREE = re.compile(r"\b(pp|dp_replicate|dp_shard|dp|cp|tp)=(\d+)")


def mesh_layout(text: str) -> dict[str, int] | None:
    """TP, PP, CP, DP and world size from torchtitan's device-mesh line; None when it is none."""
    m = _MESH.search(text)
    if m is None:
        return None
    if m.group(3) is not None:
        sizes = {k: int(v) for k, v in _DEGREE.findall(m.group(3))}
    else:
        names = [n.strip().strip("'\"") for n in m.group(1).split(",") if n.strip()]
        degrees = [int(d) for d in m.group(2).split(",") if d.strip()]
        if len(names) != len(degrees):
            return None
        sizes = dict(zip(names, degrees))
    dp = sizes.get("dp", 1) * sizes.get("dp_replicate", 1) * sizes.get("dp_shard", 1)
    out = {"tp": sizes.get("tp", 1), "pp": sizes.get("pp", 1), "cp": sizes.get("cp", 1), "dp": dp}
    out["world_size"] = out["tp"] * out["pp"] * out["cp"] * dp
    return out


class TorchtitanReader:
    def __init__(self, rec: Records) -> None:
        self.rec = rec
        self.last: tuple[int, int] | None = None  # (step, timestamp in ns) the next step's time starts at

    def line(self, ln: Line) -> bool:
        t = ln.text
        if "device mesh with" in t and (lay := mesh_layout(t)) is not None:
            self.rec.set_layout(**lay)
            return True
        if "step:" not in t or "GiB(" not in t or "context: val" in t:
            return False
        if "\x1b" in t:
            t = _ANSI.sub("", t)
        m = _LINE.search(t)
        if m is None:
            return False
        step, ts = int(m.group(2)), ln.ts
        if m.group(1):
            self.rec.step(ln, step, eval_loss=num(m.group(3)))
            if self.last is not None and ts is not None:
                self.last = (self.last[0], ts)
            return True
        iter_ms = None
        if ts is not None and (self.last is None or step > self.last[0]):  # a step's first line (of any rank)
            if self.last is not None:
                iter_ms = (ts - self.last[1]) / (step - self.last[0]) / 1e6
            self.last = (step, ts)
        tflops = m.group(8)
        self.rec.step(
            ln,
            step,
            iter_ms=iter_ms,
            loss=num(m.group(3)),
            grad_norm=num(m.group(4)) if m.group(4) else None,
            tokens_per_sec_per_gpu=float(m.group(7).replace(",", "")),
            tflops=float(tflops.replace(",", "")) if tflops else None,
        )
        gib = num(m.group(5))
        if gib is not None and gib >= 0:  # -1: the device reported no peak
            self.rec.add_memory(ln, step, None, None, gib * GB)
        return True
