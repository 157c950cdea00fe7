"""DeepSpeed lines (0.9 to 2025 releases): engine progress, throughput timer, PipelineEngine, fp16
overflows, the engine's config dump, the launcher's world layout and `see_memory_usage`.

- `[Rank 0] step=20, skipped=17, lr=[5e-05], mom=[(0.9, 0.999)]` (every `steps_per_print` steps;
  `skipped` is cumulative; `step=0` at start-up is not a step)
- `epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=25.0, CurrSamplesPerSec=25.7,
  MemAllocated=4.32GB, MaxMemAllocated=38.49GB` (older: `0/20, RunningAvgSamplesPerSec=...`; 0.3-0.6:
  `0/40, SamplesPerSec=83.5, MemAllocated=0.26GB, MaxMemAllocated=9.02GB`, the mean since the start,
  the memory figures from 0.5 on)
- PipelineEngine `steps: 100 loss: 2.1 iter time (s): 0.512 samples/sec: 62.5` (also `step: 100 / 500`)
- `OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 256, reducing to 128` (or `..., but hysteresis
  is 2. Reducing hysteresis to 1`), `Overflow detected. Skipping step. Attempted loss scale: ...`,
  `[deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: ...`
- config dump `  world_size ......... 2`, `train_micro_batch_size_per_gpu  4`, `zero_optimization_stage 1`,
  `fp16_enabled True` / `float16_config  enabled=True ...`, `bfloat16_enabled` / `bfloat16_config`
- launcher `dist_world_size=16`, `global_rank_mapping=defaultdict(<class 'list'>, {'worker-0': [0, 1]})`;
  an MPI launch (mpiexec, no DeepSpeed launcher): `Discovered MPI settings of world_rank=3, local_rank=3,
  world_size=24, master_addr=..., master_port=29500` from each rank
- the pipeline grid, `Using topology: {ProcessCoord(pipe=0, data=0): 0, ProcessCoord(pipe=1, data=0): 1}`
  (`model=` under Megatron-DeepSpeed's 3-D topology): pp, dp, tp and the world size
- `MA 1.2 GB         Max_MA 2.3 GB         CA 3.4 GB         Max_CA 3 GB`
"""

from __future__ import annotations

import ast
import json
import re

from diag.importers.logs.lines import Line, num
from diag.importers.logs.records import GB, Records

_N = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf))"
_STEP = re.compile(r"\bstep=(\d+),\s*skipped=(\d+)(?:,\s*lr=\[([^\]]*)\])?")
_MEMORY = r"(?:,\s*MemAllocated=" + _N + r"GB,\s*MaxMemAllocated=" + _N + r"GB)?"  # the timer lines' tail
_TIMER = re.compile(
    r"(?:epoch=\d+/micro_step=\d+/global_step=|\b\d+/)(\d+),\s*RunningAvgSamplesPerSec="
    + _N
    + r",\s*CurrSamplesPerSec="
    + _N
    + _MEMORY
)
# DeepSpeed 0.3-0.6's timer line: the samples/s since the start, memory from 0.5 on
_OLD_TIMER = re.compile(r"\b\d+/(\d+),\s*SamplesPerSec=" + _N + _MEMORY)
_PIPE = re.compile(
    r"\bsteps?:\s*(\d+)(?:\s*/\s*\d+)?\s+loss:\s*"
    + _N
    + r".*?iter time \(s\):\s*"
    + _N
    + r"\s+samples/sec:\s*"
    + _N
)
_OVERFLOW = re.compile(
    r"(?:OVERFLOW!\s*Rank\s+(\d+)\s+Skipping step|Overflow detected\.\s*Skipping step|"
    r"fp16 dynamic loss scale overflow!\s*Skipping step)\.?"
    r"(?:\s*Attempted loss scale:\s*" + _N + r"(?:,\s*reducing to\s*" + _N + r")?)?"
)
_CONFIG_KEYS = (
    "world_size|train_batch_size|train_micro_batch_size_per_gpu|gradient_accumulation_steps|"
    "zero_optimization_stage|zero_config|fp16_enabled|bfloat16_enabled|float16_config|bfloat16_config|global_rank"
)
_CONFIG = re.compile(r"^\s*(" + _CONFIG_KEYS + r")\s+\.*\s*(.*?)\s*$")
# a line without a keyword the config block (`in_config`) may read, in bytes: `json = {` or a `_CONFIG`
# name; or one of verl's config section (`verl.VerlReader`), which such a line reaches after this reader
CONFIG_BYTES = re.compile(rb"json = \{|" + _CONFIG_KEYS.encode() + rb"|'trainer': \{")
_ZERO_OPT = re.compile(r"Creating (?:torch\.)?(\w+) ZeRO stage (\d) optimizer")
_MPI = re.compile(r"Discovered MPI settings of world_rank=(\d+),.*?\bworld_size=(\d+)")
# `PipelineParallelGrid`'s `Using topology: {ProcessCoord(pipe=0, data=0, model=0): 0, ...}` (rank 0,
# every PipelineModule job): one coordinate per rank, so the grid's sizes are the largest + 1
_COORD = re.compile(r"ProcessCoord\(([^)]*)\):\s*\d+")
_AXES = {"pipe": "pp", "data": "dp", "model": "tp"}
_GRAD_ITER = re.compile(r"Grad overflow on iteration:?\s*(\d+)")
_SEE_MEM = re.compile(r"\bMA\s+" + _N + r"\s*GB\s+Max_MA\s+" + _N + r"\s*GB\s+CA\s+" + _N + r"\s*GB")
_JSON_BODY = re.compile(r'^\s+"|^\s*[}\]]')  # a line of DeepSpeed's indented JSON dump
JSON_MAX_LINES = 2000  # a printed config longer than this is not one
_DTYPES = {
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float32": "fp32",
    "fp32": "fp32",
}


class DeepSpeedReader:
    def __init__(self, rec: Records) -> None:
        self.rec = rec
        self.in_config = False
        self.counter: tuple[int, int] | None = None  # last (step, cumulative skipped)
        self.printed: int | None = None  # the step the last `step=` line named, and which engine printed it
        self.engine = 0
        self.grad_iter: int | None = None  # fp16 optimizers' own `Grad overflow on iteration N`
        self.json: list[str] | None = None  # the user config's lines after `json = {`, until it parses

    def line(self, ln: Line) -> bool:
        t = ln.text
        if self.json is not None:
            if _JSON_BODY.match(t):
                return self._json(t)
            self.json = None  # another line came first (interleaved output): no config to read
        if "skipped=" in t and (m := _STEP.search(t)):
            return self._step(ln, int(m.group(1)), int(m.group(2)), m.group(3))
        if "SamplesPerSec=" in t:
            if m := _TIMER.search(t):
                self.timer(ln, int(m.group(1)), num(m.group(3)), num(m.group(4)), num(m.group(5)))
                return True
            if m := _OLD_TIMER.search(t):
                self.timer(ln, int(m.group(1)), num(m.group(2)), num(m.group(3)), num(m.group(4)))
                return True
        if "iter time (s)" in t and (m := _PIPE.search(t)):
            sec = num(m.group(3))
            self.rec.weak_step(
                ln,
                int(m.group(1)),
                loss=num(m.group(2)),
                iter_ms=None if sec is None else sec * 1e3,
                samples_per_sec=num(m.group(4)),
            )
            return True
        if "Skipping step" in t and (m := _OVERFLOW.search(t)):
            rank = None if m.group(1) is None else int(m.group(1))
            self.skipping(ln, rank, num(m.group(2)), num(m.group(3)))
            return True
        if "Grad overflow on iteration" in t and (m := _GRAD_ITER.search(t)):
            self.grad_iter = int(m.group(1))
            return True
        return self._layout(ln, t)

    def timer(
        self, ln: Line, step: int, samples_per_sec: float | None, mem: float | None, max_mem: float | None
    ) -> None:
        """The throughput timer's line (`step` 0: the engine's start, no step)."""
        if step > 0:
            self.rec.one(ln, step, "samples_per_sec", samples_per_sec)
            if mem is not None:
                self.rec.add_memory(ln, step, mem * GB, max_mem * GB)  # type: ignore[operator]

    def skipping(self, ln: Line, rank: int | None, before: float | None, after: float | None) -> None:
        """A `Skipping step` line: the rank it names, the scale before and after (none printed after:
        hysteresis kept the scale)."""
        if rank is not None and ln.rank < 0:
            ln.rank = rank
        self.rec.overflow(ln, before, before if after is None else after, self.grad_iter)

    def _step(self, ln: Line, step: int, skipped: int, lr: str | None) -> bool:
        # several engines in one process (DeepSpeed-Chat's RLHF: actor and critic) print `step=N` one
        # after the other, each its own counter: the k-th line with the same N is engine k's; the first
        # engine's count the job's (summing them would count one training step twice)
        self.engine = self.engine + 1 if self.printed == step else 0
        self.printed = step
        if self.engine:
            return True
        if self.counter is not None and step > self.counter[0] and skipped >= self.counter[1]:
            self.rec.skip_counts.append((self.counter[0] + 1, step, skipped - self.counter[1]))
        elif self.counter is None and step > 0 and skipped:
            self.rec.skip_counts.append((1, step, skipped))
        self.counter = (step, skipped)
        if step > 0:  # `step=0` is printed when the engine starts: no step ran yet
            first_lr = num(lr.split(",")[0]) if lr else None
            self.rec.step(ln, step, lr=first_lr, skipped_total=skipped)
        return True

    def _layout(self, ln: Line, t: str) -> bool:
        if "DeepSpeedEngine configuration" in t:
            self.in_config = True
            return True
        if self.in_config or "print]" in t:
            body = t.split("print]", 1)[1] if "print]" in t else t
            if "json = {" in body:
                self.in_config = False
                self.json = ["{"]
            elif m := _CONFIG.match(body):
                self._config(ln, m.group(1), m.group(2))
                return True
        if "Discovered MPI settings" in t and (m := _MPI.search(t)):
            if ln.rank < 0:
                ln.rank = int(m.group(1))
            self.rec.set_layout(world_size=int(m.group(2)) or None)
            return True
        if "dist_world_size=" in t:
            self.rec.set_layout(world_size=_int(t.split("dist_world_size=", 1)[1].split()[0]) or None)
            return True
        if "global_rank_mapping=" in t and "{" in t:
            try:
                mapping = ast.literal_eval(
                    t[t.index("{", t.index("global_rank_mapping=")) : t.rindex("}") + 1]
                )
            except (ValueError, SyntaxError):
                return True
            for host, ranks in mapping.items():
                self.rec.host_ranks[str(host)] = [int(r) for r in ranks]
                for r in ranks:
                    self.rec.hosts[int(r)] = str(host)
            self.rec.set_layout(world_size=sum(len(v) for v in mapping.values()) or None)
            return True
        if "ProcessCoord(" in t:
            return self._topology(t)
        if "ZeRO stage" in t and (m := _ZERO_OPT.search(t)):
            self.rec.set_layout(zero_stage=int(m.group(2)), dtype=_DTYPES.get(m.group(1)))
            return True
        if "Max_MA" in t and (m := _SEE_MEM.search(t)):
            self.rec.add_memory(
                ln,
                None,
                num(m.group(1)) * GB,
                num(m.group(2)) * GB,  # type: ignore[operator]
                num(m.group(3)) * GB,
            )  # type: ignore[operator]
            return True
        return False

    def _topology(self, t: str) -> bool:
        """The pipeline grid's sizes from its coordinates; an axis DeepSpeed's topologies do not name
        (a user's own) counts toward the world size only."""
        coords = _COORD.findall(t)
        if not coords:
            return False
        sizes: dict[str, int] = {}
        for c in coords:
            for part in c.split(","):
                axis, _, value = part.strip().partition("=")
                if (key := _AXES.get(axis)) is not None and value.isdigit():
                    sizes[key] = max(sizes.get(key, 0), int(value) + 1)
        if "tp" not in sizes and sizes.get("pp", 0) * sizes.get("dp", 0) == len(coords):
            sizes["tp"] = 1  # `PipeDataParallelTopology`: pipe x data is every rank
        self.rec.set_layout(world_size=len(coords), **sizes)
        return True

    def _json(self, t: str) -> bool:
        """One line of the printed user config; it ends where the lines parse as one JSON object."""
        assert self.json is not None
        self.json.append(t)
        if len(self.json) > JSON_MAX_LINES:
            self.json = None
            return False
        if t.strip().startswith("}"):
            try:
                cfg = json.loads("\n".join(self.json))
            except ValueError:
                return True
            self.json = None
            if isinstance(cfg, dict) and self.rec.ds_config is None:
                self.rec.ds_config = cfg
        return True

    def _config(self, ln: Line, key: str, value: str) -> None:
        v = value.strip()
        lay = self.rec.set_layout
        if key == "world_size":
            lay(world_size=_int(v))
        elif key == "train_batch_size":
            lay(global_batch=_int(v))
        elif key == "train_micro_batch_size_per_gpu":
            lay(micro_batch=_int(v))
        elif key == "gradient_accumulation_steps":
            lay(grad_accum=_int(v))
        elif key == "zero_optimization_stage":
            lay(zero_stage=_int(v))
        elif key == "zero_config" and (m := re.search(r"\bstage=(\d)", v)):
            lay(zero_stage=int(m.group(1)))
        elif key in ("fp16_enabled", "bfloat16_enabled") and v == "True":
            lay(dtype="fp16" if key.startswith("fp16") else "bf16")
        elif key in ("float16_config", "bfloat16_config") and v.startswith("enabled=True"):
            lay(dtype="fp16" if key.startswith("float16") else "bf16")


def _int(text: str) -> int | None:
    v = num(text)
    return None if v is None or v != v else int(v)
