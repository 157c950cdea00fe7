"""What the family readers fill while a log is read, and how it becomes frames.

- steps: one record per (framework iteration number): the figures every line about that iteration
  printed (a DeepSpeed `step=` line, its timer line and a PipelineEngine line merge into one).
- overflows: each skipped step once, however many ranks printed it (see `Overflows`).
- layout: world size, TP/PP/DP, ZeRO stage, dtype, batch sizes from the start-up dumps.
- memory: bounded reductions (`MemoryRows`), not every line: a long multi-rank log prints one per rank
  and step.
- failures: see `crash`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from diag import schema
from diag.importers.logs.lines import Line

# log_step columns, in order; every figure in the unit named (ms, per second, bytes); `loss_nonfinite`
# marks a printed nan/inf loss (a NaN `loss` alone may just be a line that printed none)
STEP_COLUMNS = (
    "rank",
    "step",
    "ts",
    "iter_ms",
    "samples_per_sec",
    "tokens_per_sec",
    "tokens_per_sec_per_gpu",
    "tflops",
    "loss",
    "lr",
    "grad_norm",
    "loss_scale",
    "skipped_iters",
    "skipped_total",
    "nan_iters",
    "loss_nonfinite",
    "consumed_samples",
    "global_batch",
    "epoch",
    "eval_loss",
    "eval_ppl",
)
MB, GB = 1 << 20, 1 << 30
_MEMORY_ROW = ("rank", "step", "ts", "device", "allocated", "reserved", "peak")
SAME_STEP_NS = 100_000_000  # ranks print one step's overflow within this of each other
MEMORY_RANKS = 8  # ranks whose memory timeline a log keeps (the lowest); the others keep their peaks
MEMORY_ROWS = 512  # rows a kept rank's timeline holds at least, at most twice this
_PEAK_COLUMNS = (4, 5, 6)  # allocated, reserved, peak in a memory row


@dataclass
class Overflow:
    step: int | None
    before: float | None
    after: float | None
    rank: int
    ts: int | None
    source: str = "log"
    key: int | None = None  # the optimizer's own `Grad overflow on iteration N`, when printed


@dataclass
class Failure:
    """One sign of a failed rank: an exception, OOM, NCCL timeout or a launcher's exit code."""

    kind: str  # exception | oom | nccl_timeout | exit | interrupted
    rank: int
    line: int
    ts: int | None
    exc: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the log line itself, as printed (up to 300 characters)


WEAK = "_weak"  # a step record's key: the figures a later iteration line of the job may replace


class Records:
    """Everything read from one log, in the framework's own numbering."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, Any]] = {}
        self.last_step = 0  # the highest iteration a progress line named so far
        self.last_step_line = 0  # the line number of the last progress line
        self.ranks: set[int] = set()
        self.hosts: dict[int, str] = {}
        self.host_ranks: dict[str, list[int]] = {}  # DeepSpeed launcher: host -> its global ranks
        self.layout: dict[str, Any] = {}
        self.memory = MemoryRows()
        self.run: dict[str, float] = {}
        self.args: dict[str, str] = {}  # Megatron's arguments dump, as printed (framework detection)
        self.ds_config: dict[str, Any] | None = None  # DeepSpeed's `json = {` user config
        self.overflows: list[Overflow] = []
        self._seen: dict[tuple[int, int], int] = {}  # (segment, rank) -> overflow lines seen
        self._segment: list[Overflow] = []  # the overflows since the last progress line
        # skipped-step counters: (first step, last step, count) per printed interval
        self.skip_counts: list[tuple[int, int, int]] = []
        self.failures: list[Failure] = []
        self.families: set[str] = set()  # deepspeed / megatron / hf: which readers found lines

    def step(self, line: Line, step: int, **figures: Any) -> dict[str, Any]:
        """Merge figures into iteration `step`'s record (None values do not overwrite)."""
        rec = self.steps.get(step)
        if rec is None:
            rec = self.steps[step] = {"rank": line.rank, "step": step, "ts": line.ts}
        for k, v in figures.items():
            if v is not None and rec.get(k) is None:
                rec[k] = v
        return self.progressed(line, step, rec, figures.get("loss"))

    def merge(self, line: Line, step: int, figures: dict[str, Any]) -> dict[str, Any]:
        """`step` for figures with no None value (a figure a record holds is never None): the keys it
        lacks taken at once, not one test per figure; and the figures a `weak_step` line gave."""
        rec = self.steps.get(step)
        if rec is None:
            rec = self.steps[step] = {"rank": line.rank, "step": step, "ts": line.ts, **figures}
        else:
            if WEAK in rec:
                for k in rec.pop(WEAK) & figures.keys():
                    rec[k] = figures[k]
            if not figures.keys() <= rec.keys():
                for k in figures.keys() - rec.keys():
                    rec[k] = figures[k]
        return self.progressed(line, step, rec, figures.get("loss"))

    def weak_step(self, line: Line, step: int, **figures: Any) -> dict[str, Any]:
        """`step` for a line whose figures the job's own iteration line, where it prints one, states
        better: DeepSpeed's `steps: N loss: .. iter time (s): ..` under Megatron-DeepSpeed prints
        before Megatron's line (4-decimal loss, the engine's time without Megatron's own, 92.0 ms
        median where Megatron says 99.85). A later `merge` of the step takes its figures instead."""
        had = self.steps.get(step, {})
        set_here = {k for k, v in figures.items() if v is not None and k not in had}
        rec = self.step(line, step, **figures)
        if set_here:
            rec.setdefault(WEAK, set()).update(set_here)
        return rec

    def one(self, line: Line, step: int, key: str, value: Any) -> dict[str, Any]:
        """`step` with one figure (not the loss): the frequent lines' update, without a figures dict."""
        rec = self.steps.get(step)
        if rec is None:
            rec = self.steps[step] = {"rank": line.rank, "step": step, "ts": line.ts}
        if value is not None and rec.get(key) is None:
            rec[key] = value
        return self.progressed(line, step, rec, None)

    def progressed(self, line: Line, step: int, rec: dict[str, Any], loss: Any) -> dict[str, Any]:
        """What `step`, `merge` and `one` note of a record just updated: a printed nan/inf loss (not a
        missing one), and the last progress line when `step` is the newest."""
        if isinstance(loss, float) and not math.isfinite(loss):
            rec["loss_nonfinite"] = True
        if step >= self.last_step:
            if step > self.last_step:
                self._segment = []
            self.last_step, self.last_step_line = step, line.no
        return rec

    def overflow(self, line: Line, before: float | None, after: float | None, key: int | None = None) -> None:
        """One `Skipping step` line. Lines name no step: an overflow belongs to a step after the last
        progress line. The k-th line a rank prints since then is the k-th skipped step, so the same
        step printed by several ranks counts once. Lines without a rank are the same step as the
        previous one while they repeat its scales and its optimizer iteration `key` (or, without
        one, come within `SAME_STEP_NS` of it: all ranks print at once)."""
        seg = self._segment
        if line.rank >= 0:
            k = self._seen.get((self.last_step, line.rank), 0)
            self._seen[(self.last_step, line.rank)] = k + 1
            if k < len(seg):
                return
        elif (
            seg
            and seg[-1].rank < 0
            and (seg[-1].before, seg[-1].after) == (before, after)
            and _same_step(seg[-1], key, line.ts)
        ):
            return
        o = Overflow(self.last_step + 1 + len(seg), before, after, line.rank, line.ts, key=key)
        seg.append(o)
        self.overflows.append(o)

    def set_layout(self, **values: Any) -> None:
        for k, v in values.items():
            if v is not None and self.layout.get(k) is None:
                self.layout[k] = v

    def add_memory(
        self,
        line: Line,
        step: int | None,
        allocated: float | None,
        peak: float | None,
        reserved: float | None = None,
    ) -> None:
        # a tuple per line (the frame's columns), not a dict: a long log holds many
        self.memory.add(
            (line.rank, self.last_step if step is None else step, line.ts, "log", allocated, reserved, peak)
        )

    # -- frames -------------------------------------------------------------------------------

    def step_frame(self) -> pd.DataFrame:
        rows = [self.steps[s] for s in sorted(self.steps)]
        _times_from_timestamps(rows)
        return pd.DataFrame(rows, columns=list(STEP_COLUMNS))

    def overflow_frame(self) -> pd.DataFrame:
        """Skipped steps; a scale the overflow line did not print is the one the step lines give:
        after = that iteration's logged loss scale (printed after its update), before = the
        previous iteration's (Megatron prints only counters, no overflow lines)."""
        from diag.importers.logs.overflow import reconcile

        def logged(step: int | None) -> float | None:
            rec = self.steps.get(step) if step is not None else None
            scale = rec.get("loss_scale") if rec else None
            return float(scale) if scale is not None and scale > 0 else None  # -1: DeepSpeed's own

        rows = [
            {
                "rank": o.rank,
                "step": o.step,
                "ts": o.ts,
                "overflow": True,
                "scale_before": o.before if o.before is not None else logged((o.step or 0) - 1),
                "scale_after": o.after if o.after is not None else logged(o.step),
                "skipped_steps": None,
                "source": o.source,
            }
            for o in reconcile(self.overflows, self.skip_counts)
        ]
        return pd.DataFrame(rows, columns=["rank", *schema.FIELDS[schema.OVERFLOW]])

    def memory_frame(self) -> pd.DataFrame:
        rows = pd.DataFrame(self.memory.rows(), columns=list(_MEMORY_ROW))
        for c in ("capacity", "rss", "module"):
            rows[c] = None
        return rows[["rank", *schema.FIELDS[schema.MEMORY]]]


class MemoryRows:
    """Memory rows in bounded space, whatever the log's length and ranks: what the report and rules
    read of them. Each rank's highest allocated, reserved and peak (the first row holding each) and
    its last row; and the timeline of the lowest `MEMORY_RANKS` ranks, thinned evenly (every k-th
    row, k doubling whenever `2 * MEMORY_ROWS` are held). A log with fewer rows keeps every one."""

    def __init__(self) -> None:
        self.n = 0  # rows added: each row's place, so the kept ones come out in the log's order
        self.kept: dict[int, tuple[int, tuple[Any, ...]]] = {}  # place -> (place, row) of the rows kept
        self.timeline: dict[int, tuple[int, list[int]]] = {}  # rank -> (stride, places of its rows kept)
        self.seen: dict[int, int] = {}  # rank -> its rows added
        self.marks: dict[int, list[int | None]] = {}  # rank -> places of its highest columns, and last

    def add(self, row: tuple[Any, ...]) -> None:
        rank, place = row[0], self.n
        self.n += 1
        k = self.seen.get(rank, 0)
        self.seen[rank] = k + 1
        marks = self.marks.get(rank)
        if marks is None:
            marks = self.marks[rank] = [None] * (len(_PEAK_COLUMNS) + 1)
        kept = self.kept
        moved = [marks[-1]]  # the rows marks held before this one took their place
        for i, c in enumerate(_PEAK_COLUMNS):
            v = row[c]
            if v is not None and v == v and (marks[i] is None or v > kept[marks[i]][1][c]):  # type: ignore[index]
                moved.append(marks[i])
                marks[i] = place
        marks[-1] = place  # the new row is its rank's last: held, whether or not the timeline takes it
        kept[place] = (place, row)
        self._in_timeline(rank, k, place)
        gone = {p for p in moved if p is not None and p not in marks}  # rows no mark holds any more
        if gone:
            self._forget(gone, rank)

    def _in_timeline(self, rank: int, k: int, place: int) -> bool:
        line = self.timeline.get(rank)
        if line is None:
            if len(self.timeline) >= MEMORY_RANKS:
                top = max(self.timeline)
                if rank > top:
                    return False
                _, places = self.timeline.pop(top)  # a lower rank's timeline replaces the highest's
                self._forget(set(places), top)
            line = self.timeline[rank] = (1, [])
        stride, places = line
        if k % stride:
            return False
        places.append(place)
        if len(places) >= 2 * MEMORY_ROWS:
            dropped = set(places[1::2])
            self.timeline[rank] = (2 * stride, places[::2])
            self._forget(dropped, rank)
        return True

    def _forget(self, places: set[int | None], rank: int) -> None:
        """Drop the rows at `places` that neither the rank's marks nor its timeline still hold."""
        held = set(self.marks.get(rank, ()))
        line = self.timeline.get(rank)
        for p in places:
            if p is None or p in held or p not in self.kept:
                continue
            if line is not None and _holds(line[1], p):
                continue
            del self.kept[p]

    def rows(self) -> list[tuple[Any, ...]]:
        return [row for _, row in sorted(self.kept.values(), key=lambda pr: pr[0])]

    def __len__(self) -> int:
        return len(self.kept)


def _holds(places: list[int], place: int) -> bool:
    i = bisect_left(places, place)
    return i < len(places) and places[i] == place


def _same_step(prev: Overflow, key: int | None, ts: int | None) -> bool:
    if prev.key is not None and key is not None:
        return prev.key == key
    if prev.ts is None or ts is None:
        return prev.ts is None and ts is None
    return abs(ts - prev.ts) <= SAME_STEP_NS


def _times_from_timestamps(rows: list[dict[str, Any]]) -> None:
    """Step time where the log prints none: the time between two progress lines over the
    iterations between them (DeepSpeed prints `step=N` every `steps_per_print` steps)."""
    prev = None
    for rec in rows:
        if rec.get("iter_ms") is None and prev is not None and rec.get("ts") and prev.get("ts"):
            n = rec["step"] - prev["step"]
            dt = rec["ts"] - prev["ts"]
            if n > 0 and dt >= 0:
                rec["iter_ms"] = dt / n / 1e6
        prev = rec
