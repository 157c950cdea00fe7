"""Which framework ran the job, at which version, with which settings: what a rule needs before it
names a flag or a config key (a Megatron-LM flag is no fix for a Megatron-DeepSpeed job, DeepSpeed's
`overlap_comm` none for a torchrec one).

Evidence, strongest first: the diag header (argv, imported versions, the engine's ds_config and
zero_config), the log's dumps (Megatron's arguments, DeepSpeed's user config), then Kineto op names.
`Job.flags` keeps a fix's arguments only when every one exists in that framework's parser at the
job's version (`knob_table`, generated from the real parsers and release tags by
scripts/knob_table.py); `Job.applicable` is the same check for a whole fix, ds_config keys included
(the registry drops a fix that fails it, whichever rule made it).
"""

from __future__ import annotations

import os
import re
import weakref
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from diag.analyzers import config

from diag.findings import Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

MEGATRON_DEEPSPEED = "megatron-deepspeed"
MEGATRON_LM = "megatron-lm"
DEEPSPEED = "deepspeed"
TORCHREC = "torchrec"
FSDP = "fsdp"
DDP = "ddp"
TORCH = "torch"  # a plain PyTorch training loop (DDP or the job's own collectives), no engine
UNKNOWN = "unknown"

# Kineto op-name signs (record_function / module names each framework emits), checked in this order
_OP_SIGNS = (
    (TORCHREC, re.compile(r"torchrec|fbgemm::|^## .* ##$|KJTAllToAll|ShardedEmbedding", re.I)),
    (FSDP, re.compile(r"FullyShardedDataParallel|^FSDP::", re.I)),
    (DEEPSPEED, re.compile(r"deepspeed|DeepSpeedEngine", re.I)),
    (DDP, re.compile(r"DistributedDataParallel|torch\.distributed\.ddp\.reducer|reducer::", re.I)),
)
_MEGATRON_SCRIPT = re.compile(r"(^|/)(pretrain_\w+|megatron\w*)\.py$")
_MEGATRON_FLAGS = (
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--num-layers",
    "--micro-batch-size",
    "--global-batch-size",
)
_LOOP_LOGS = ("torchtitan", "nanogpt")  # log families (importers/logs) of trainers with their own loop
_DS_FLAGS = ("--deepspeed", "--deepspeed_config", "--deepspeed-config", "--zero-stage")


@dataclass
class Job:
    """The framework (one of the names above), its version as recorded, the Megatron arguments and
    DeepSpeed config as the job ran them, and the evidence for each conclusion."""

    framework: str = UNKNOWN
    version: str | None = None
    deepspeed_version: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    ds_config: dict[str, Any] = field(default_factory=dict)
    zero: dict[str, Any] = field(default_factory=dict)
    why: list[str] = field(default_factory=list)
    # the HF Trainer drives it (its log dicts and bar in the log): it fills ds_config's "auto" values
    # from its TrainingArguments and refuses a ds_config value that differs from theirs
    hf_trainer: bool = False

    @property
    def megatron(self) -> bool:
        return self.framework in (MEGATRON_DEEPSPEED, MEGATRON_LM)

    @property
    def deepspeed(self) -> bool | None:
        """True: DeepSpeed's engine runs the job; False: another framework does; None: not known."""
        if self.framework in (DEEPSPEED, MEGATRON_DEEPSPEED):
            return True
        return None if self.framework == UNKNOWN else False

    @property
    def config_seen(self) -> bool:
        """Was any of the job's DeepSpeed config recorded (else settings are only code defaults)?"""
        return bool(self.ds_config or self.zero)

    def has_flag(self, flag: str) -> bool:
        """Does the job's framework, at the job's version where it is known, have this argument?"""
        current = _knobs().ARGS.get(self.framework, frozenset())
        return knob_exists(self.framework, flag, self.version, current)

    def spelling(self, *names: str) -> str | None:
        """The one of `names` (spellings of one argument across versions) that the job itself passed,
        else the first its framework and version has, else None."""
        have = [n for n in names if self.has_flag(n)]
        return next((n for n in have if self.arg(n) is not None), have[0] if have else None)

    def has_ds_key(self, key: str, section: str | None = None) -> bool:
        """Does the job's DeepSpeed version accept this ds_config key (top level, or in `section`:
        only "zero_optimization" is tabled per key)?"""
        if section == "zero_optimization":
            return knob_exists(section, key, self.deepspeed_version, _knobs().ZERO_KEYS)
        if section is None:
            return knob_exists("ds_config", key, self.deepspeed_version, None)
        return True

    def applicable(self, fix: Fix) -> bool:
        """Every Megatron argument and every ds_config key the fix names exists in the job's framework
        at its version (a fix for another framework's job is the rules' business: `flags`)."""
        if self.megatron and not all(self.has_flag(a) for a in fix.megatron_args if a.startswith("--")):
            return False
        for key, value in (fix.ds_config or {}).items():
            if not self.has_ds_key(key):
                return False
            if isinstance(value, dict) and not all(self.has_ds_key(k, key) for k in value):
                return False
        return True

    def flags(self, *args: str) -> list[str]:
        """`args` (flags and their values) when this is a Megatron job and every flag exists in its
        parser; else [] (a fix naming a flag the job's framework lacks is not applicable)."""
        if not self.megatron:
            return []
        if all(self.has_flag(a) for a in args if a.startswith("--")):
            return list(args)
        return []

    def arg(self, name: str) -> Any:
        """A Megatron argument's value as the job ran it (`num_layers` or `--num-layers`), else None."""
        key = name.lstrip("-").replace("-", "_")
        return self.args.get(key)


def _knobs() -> ModuleType:
    """The generated knob tables (1,300 lines): imported when a fix is first checked, which a run
    without findings never does."""
    from diag.analyzers import knob_table

    return knob_table


def version_key(version: str | None) -> tuple[int, ...] | None:
    """ "0.12.0rc1" / "0.15.0+cu121" / "core_v0.9.0" -> (0, 12, 0); None when no number is in it."""
    got = re.findall(r"\d+", re.split(r"[+\-]|rc|a|b|dev", str(version or "").removeprefix("core_v"))[0])
    return tuple(int(x) for x in got[:3]) if got else None


def knob_exists(table: str, knob: str, version: str | None, current: frozenset[str] | None) -> bool:
    """`knob` in `table` ("megatron-lm", "zero_optimization", "ds_config", or a table without ranges)
    at `version`. Without a version or ranges: the current table (`current`; None: not tabled, taken
    as present). A version outside the releases read is judged as the nearest one read."""
    ranges = _knobs().RANGES.get(table)
    v = version_key(version)
    if ranges is None or v is None:
        return current is None or knob in current
    versions, spans = ranges
    span = spans.get(knob)
    if span is None:  # every release read has it (or none does)
        return current is None or knob in current
    first, last = (version_key(versions[0]) or ()), (version_key(versions[-1]) or ())
    v = min(max(v, first), last)
    lo, hi = span
    return (version_key(lo) or ()) <= v and (hi is None or v <= (version_key(hi) or ()))


def _argv_args(argv: list[str]) -> dict[str, Any]:
    """`--a-b 3 --c` -> {"a_b": "3", "c": True}: the command line as Megatron's parser would see it."""
    out: dict[str, Any] = {}
    for i, a in enumerate(argv):
        if not a.startswith("--"):
            continue
        key, eq, val = a[2:].partition("=")
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        value: Any = val if eq else (nxt if nxt is not None and not nxt.startswith("--") else True)
        out.setdefault(key.replace("-", "_"), value)
    return out


def _value(v: Any) -> Any:
    """A printed argument (`'True'`, `'4'`, `'None'`) as a Python value."""
    if not isinstance(v, str):
        return v
    if v in ("True", "False"):
        return v == "True"
    if v == "None":
        return None
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def _ops(trace: Trace) -> list[str]:
    names: set[str] = set()
    for kind in ("cpu_op", "kernel"):
        df = trace.frame(kind)
        if not df.empty and "name" in df:
            names |= {str(n) for n in df["name"].astype(str).unique()[:20000]}
    return sorted(names)


def detect(trace: Trace) -> Job:
    """The job's framework, version and effective settings from everything the trace holds."""
    job = Job(ds_config=config.ds_config(trace), zero=config.zero_config(trace))
    heads = [trace.headers[r] for r in trace.ranks]
    argv = next((list(h["argv"]) for h in heads if isinstance(h.get("argv"), list)), [])
    args = {k: _value(v) for h in heads for k, v in (h.get("megatron_args") or {}).items()}
    args.update({k: _value(v) for k, v in _argv_args(argv).items() if k not in args})
    job.args = args
    core = next((h["megatron"] for h in heads if h.get("megatron")), None)
    job.deepspeed_version = next((h["deepspeed"] for h in heads if h.get("deepspeed")), None)
    layout = trace.layout()

    megatron = []
    if core:
        megatron.append(f"megatron.core {core} imported")
    if argv and _MEGATRON_SCRIPT.search(argv[0]):
        megatron.append(f"script {os.path.basename(argv[0])}")
    if any(a in argv for a in _MEGATRON_FLAGS):
        megatron.append("Megatron arguments on the command line")
    if any(h.get("megatron_args") for h in heads):
        megatron.append("Megatron's arguments dump in the log")
    ds = []
    if job.config_seen or layout.get("zero_stage") is not None:
        ds.append("DeepSpeed engine config recorded")
    if any("deepspeed" in (h.get("log_families") or ()) for h in heads):
        ds.append("DeepSpeed engine lines in the log")
    if any(a.split("=")[0] in _DS_FLAGS for a in argv) or args.get("deepspeed") is True:
        ds.append("--deepspeed in the arguments")
    if megatron and ds:
        job.framework, job.version = MEGATRON_DEEPSPEED, core
    elif megatron:
        job.framework, job.version = MEGATRON_LM, core
    elif ds:
        job.framework, job.version = DEEPSPEED, job.deepspeed_version
    job.why = megatron + ds
    job.hf_trainer = any("hf" in (h.get("log_families") or ()) for h in heads)
    if job.framework == UNKNOWN:
        ops = _ops(trace)
        for name, sign in _OP_SIGNS:
            hit = next((o for o in ops if sign.search(o)), None)
            if hit is not None:
                job.framework = name
                job.why.append(f"op {hit!r} in the trace")
                break
    if job.framework == UNKNOWN:
        own = sorted({f for h in heads for f in h.get("log_families") or () if f in _LOOP_LOGS})
        if own:  # a log only these print: their training loops run no DeepSpeed engine, no Megatron
            job.framework = TORCH
            job.why.append(f"{', '.join(own)} progress lines in the log")
    if job.framework == UNKNOWN:
        loop = _loop_origin(heads)
        if loop is not None:
            job.framework = TORCH
            job.why.append(f"steps numbered by the training loop ({loop}), not by an engine")
    return job


def _loop_origin(heads: list[dict[str, Any]]) -> str | None:
    """Every rank's steps numbered by the job's own loop or torch's optimizer (diag's `step_origin`):
    no DeepSpeed engine or Megatron optimizer took them (the steps collector numbers by those
    first; a DeepSpeed engine that runs the optimizer always shows). None where a rank says
    otherwise or nothing."""
    origins = [h.get("step_origin") for h in heads]
    plain = all(isinstance(o, str) and (o.startswith("loop:") or o == "optimizer") for o in origins)
    return str(origins[0]) if origins and plain else None


_JOBS: weakref.WeakKeyDictionary[Metrics, Job] = weakref.WeakKeyDictionary()


def job_of(metrics: Metrics) -> Job:
    """`detect` once per analysis stage (every rule asks)."""
    got = _JOBS.get(metrics)
    if got is None:
        got = _JOBS[metrics] = detect(metrics.trace)
    return got
