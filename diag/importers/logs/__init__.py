"""Import DeepSpeed, Megatron-LM / Megatron-DeepSpeed / NeMo, HF Trainer, verl, nanoGPT and torchtitan
training logs.

Each line is read once (`lines.Line` peels the launcher's rank/host/time prefixes) and offered to the
family readers; what they find becomes frames of the `Trace`:
- `log_step`: one row per framework iteration number (Megatron's `iteration`, DeepSpeed's `global_steps`,
  HF's optimizer step, NeMo's `global_step`, verl's `step:`, nanoGPT's `iter`, torchtitan's `step:`):
  step time in ms, samples/s, tokens/s, TFLOPs as printed, loss, lr, grad norm, loss scale, skipped
  counters, eval loss (`records.STEP_COLUMNS`);
- `overflow`: each skipped step once (`overflow.reconcile`), `memory`: memory lines in bytes;
- the layout (world size, TP/PP/DP, ZeRO stage, dtype, batch sizes) into every rank's header;
- a failed job (`crash.verdict`) becomes a `JobFailed` problem: one line naming the failure, its ranks,
  the first of them and the last completed step; `log_failure` holds each sign of it, for rules.
Unknown lines are ignored; a log with nothing readable is an `ImportProblem`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from diag import schema
from diag.importers.errors import ImportProblem
from diag.importers.logs.crash import CrashReader, failure_frame, verdict
from diag.importers.logs.deepspeed import CONFIG_BYTES, DeepSpeedReader
from diag.importers.logs.fastpath import FastLines
from diag.importers.logs.hf import HFReader
from diag.importers.logs.lines import read_lines
from diag.importers.logs.megatron import ARG_BYTES, MegatronReader
from diag.importers.logs.nanogpt import NanoGPTReader
from diag.importers.logs.prefilter import keyword_lines
from diag.importers.logs.records import STEP_COLUMNS, Records
from diag.importers.logs.torchtitan import TorchtitanReader
from diag.importers.logs.verl import VerlReader
from diag.trace.model import LoadProblem

LOG_STEP_COLUMNS = STEP_COLUMNS
# bytes whose presence in a small file's head makes it a log (detect.py)
MARKERS = (
    b"iteration",
    b"OVERFLOW!",
    b"Skipping step",
    b"memory (MB)",
    b"step=",
    b"[Rank",
    b"Traceback",
    b"arguments",
    b"{'loss'",
    b"{'train_runtime'",
    b"global_step",
    b"iter time (s)",
    b"exits with return code",
    b"ChildFailedError",
    b"Watchdog caught",
    b"dist_world_size",
    b"Discovered MPI settings",
    b"DeepSpeedEngine configuration",
    b"timing_s/step:",
    b"(TaskRunner pid=",
    b"(main_task pid=",
    b"ms, mfu ",
    b", val loss ",
    b"GiB(",
)


@dataclass
class JobFailed(LoadProblem):
    """The log shows the job failed: not an unreadable input, so `diag analyze` exits 1, not 2."""

    job_failed: bool = True


@dataclass
class LogImport:
    ranks: list[int]
    frames: dict[str, pd.DataFrame]
    headers: dict[int, dict[str, Any]] = field(default_factory=dict)
    problems: list[LoadProblem] = field(default_factory=list)


def merge_parts(parts: dict[str, list[pd.DataFrame]]) -> None:
    """Several logs of one job (one per node or rank, or a console log next to them): iteration
    records and skipped steps are the job's, so each counts once however many logs print it. Every
    rank skips every overflowing step, so the log with the most skipped steps has them all (and
    the first such, in path order, usually the progress lines that place them)."""
    steps = parts.get("log_step", [])
    if len(steps) > 1:
        parts["log_step"] = [first_per_step(steps)]
    ov = parts.get(schema.OVERFLOW, [])
    logs = [df for df in ov if _from_log(df)]
    if len(logs) > 1:
        best = max(logs, key=len)  # max() keeps the first of equals
        parts[schema.OVERFLOW] = [df for df in ov if not _from_log(df)] + [best]


def first_per_step(steps: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per step: each figure from the first of `steps` that has it."""
    both = pd.concat(steps, ignore_index=True)
    return both.groupby("step", sort=True, as_index=False).first()[list(both.columns)]


def _from_log(df: pd.DataFrame) -> bool:
    return "source" in df.columns and df["source"].astype(str).str.startswith("log").all()


def read_records(path: str, every_line: bool = False) -> Records:
    """What the readers find in `path`. Only lines holding a reader's keyword reach them (`prefilter`),
    which reads what offering every line (`every_line`: the plain reference path) reads."""
    rec = Records()
    megatron, deepspeed, hf = MegatronReader(rec), DeepSpeedReader(rec), HFReader(rec)
    verl = VerlReader(rec)
    readers = [
        ("megatron", megatron),
        ("deepspeed", deepspeed),
        ("hf", hf),
        ("verl", verl),
        ("nanogpt", NanoGPTReader(rec)),
        ("torchtitan", TorchtitanReader(rec)),
    ]
    crash = CrashReader(rec)

    def seen(rank: int, host: str | None) -> None:
        rec.ranks.add(rank)
        if host:
            rec.hosts.setdefault(rank, host)

    def busy() -> bool | re.Pattern[bytes]:
        """A reader inside a block of lines: True when it reads every line, the pattern of the lines
        without a keyword it may read when it reads only those (Megatron's arguments dump, DeepSpeed's
        config dump: a long log's other lines need not become `Line`s while one is open)."""
        if (
            deepspeed.json is not None
            or crash.open_tb
            or crash.child is not None
            or verl.pending is not None
            or verl.config.depth > 0
        ):
            return True
        if megatron.in_args:  # it takes every line: the readers after it see none
            return ARG_BYTES
        return CONFIG_BYTES if deepspeed.in_config else False

    fast = FastLines(rec, crash, megatron, deepspeed, hf, verl, seen)
    for ln in read_lines(path) if every_line else keyword_lines(path, busy, seen, fast):
        if ln.rank >= 0:
            seen(ln.rank, ln.host)
        if verl.pending is not None and verl.continues(ln):  # a hard-wrapped metric line's next piece
            continue
        if crash.line(ln):
            continue
        for name, reader in readers:
            if reader.line(ln):
                rec.families.add(name)
                break
    verl.flush()
    megatron.flush()
    hf.flush()
    return rec


def import_log(path: str, every_line: bool = False) -> LogImport:
    """Frames, headers (with the layout) and problems of one log; `ImportProblem` when nothing in it
    is readable."""
    rec = read_records(path, every_line)
    frames = {
        "log_step": rec.step_frame(),
        schema.OVERFLOW: rec.overflow_frame(),
        schema.MEMORY: rec.memory_frame(),
    }
    frames["log_failure"] = failure_frame(rec, path)
    if rec.run:
        frames["log_run"] = pd.DataFrame([{"rank": -1, "key": k, "value": v} for k, v in rec.run.items()])
    frames = {k: v for k, v in frames.items() if not v.empty}
    failed = verdict(rec)
    if not frames and not rec.layout and failed is None:
        raise ImportProblem(
            "no DeepSpeed/Megatron/HF Trainer/verl/nanoGPT progress, torchtitan metrics, overflow, layout "
            "or error lines found"
        )
    layout = {k: rec.layout[k] for k in schema.LAYOUT_KEYS if rec.layout.get(k) is not None}
    if "world_size" not in layout and all(k in layout for k in ("tp", "pp", "dp")):
        layout["world_size"] = math.prod(layout.get(k, 1) for k in schema.WORLD_FACTORS)
    world = layout.get("world_size")
    ranks = set(rec.ranks) | set(rec.hosts)
    if isinstance(world, int) and 0 < world <= 1 << 16:
        # a number past the world size is no rank: DeepSpeed's pipeline layer list (`    70: LayerNorm`)
        # reads like srun's `--label` prefix
        ranks = {r for r in ranks if r < world} | set(range(world))
    for df in frames.values():
        ranks |= {int(r) for r in df["rank"].dropna() if r >= 0}
    found: dict[str, Any] = {"log_families": sorted(rec.families)}
    if rec.args:
        found["megatron_args"] = dict(rec.args)
    if rec.ds_config is not None:
        found["ds_config"] = rec.ds_config
    headers = {
        r: {
            "rank": r,
            "source": "log",
            **layout,
            **found,
            **({"host": rec.hosts[r]} if r in rec.hosts else {}),
        }
        for r in sorted(ranks)
    }
    problems: list[LoadProblem] = [JobFailed(path, failed[1], failed[0])] if failed else []
    return LogImport(sorted(ranks), frames, headers, problems)
