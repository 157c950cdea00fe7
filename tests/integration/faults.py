"""The fault matrix (issue 17): real 2-rank jobs on CPU/gloo, each fault planted in a real run, with
diag in the job from the start, and what diag says of it.

A cell is one job x one fault. Faults are planted the way they happen: a straggler and an fp16
overflow storm by the workload's own switches (`--slow-rank`, `--overflow-at`), a hang and a dead
rank from outside, by SIGSTOP / SIGKILL of one rank's process after a few iterations. The verdicts
read are `diag analyze`'s findings on the trace (post-mortem, every rule) and, for a hang, `diag
stacks` on the live launcher (the time from the SIGSTOP to its verdict is measured). A finding of
severity warning or critical other than the expected one is a false alarm.

Used by tests/integration/test_fault_matrix.py (one test per cell) and bench/faults.py (the table in
docs/faults.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from diag.analyzers import run_all

import diag
from diag.findings import Finding
from diag.procs import ranks_under
from tests.integration.runs import DDP, GPT, MEGATRON, Runs
from tests.workloads import launch

ALARM = ("warning", "critical")
SLOW = ("--slow-rank", "1", "--slow-ms", "80")
INJECT_AFTER = 6  # iterations printed before a hang / kill is planted
STACKS_AFTER = 1.0  # seconds from a SIGSTOP to `diag stacks`


@dataclass(frozen=True)
class Cell:
    job: str  # the job, as the table names it
    fault: str  # "healthy" for a control
    module: str
    args: tuple[str, ...]
    expect: str | None = None  # the rule that must fire (None: no finding at all)
    rank: int | None = None  # the rank it must name
    inject: str | None = None  # "stop" (hang) or "kill" (a rank dies), from outside, on `rank`
    known_gap: str | None = None  # why diag does not get this cell right yet (an xfail reason)
    strict: bool = True  # the gap shows on every run (a strict xfail)

    @property
    def name(self) -> str:
        return f"{self.job}-{self.fault}".replace(" ", "_")


DDP_ARGS = ("--steps", "12")
ZERO2 = ("--zero", "2", "--steps", "10")
TP_ARGS = ("--steps", "13")  # test_agent_megatron's run: shared through the run cache
LONG = ("--steps", "4000", "--step-sleep", "0.05")  # runs until the fault is planted, then killed

CELLS: tuple[Cell, ...] = (
    Cell("DDP", "healthy", DDP, DDP_ARGS),
    Cell(
        "DDP",
        "straggler",
        DDP,
        (*DDP_ARGS, *SLOW),
        expect="straggler",
        rank=1,
        known_gap=(
            "DDP's bucket all-reduces are async (the Reducer waits for them in C++), and the blocked-time "
            "metric the straggler rule reads (diag.metrics.comms.blocking_per_step) counts blocking ops "
            "only: rank 0's 80 ms waits are invisible, so no rank shows waiting time"
        ),
    ),
    Cell(
        "DDP",
        "hang",
        DDP,
        LONG,
        expect="hang_desync",
        rank=1,
        inject="stop",
        known_gap=(
            "the waiting rank waits for the bucket all-reduce inside Tensor.backward (DDP's Reducer, from "
            "C++), so `diag stacks` sees no collective frame: 'rank 0: not in a collective', no verdict"
        ),
    ),
    Cell(
        "DDP",
        "rank dies",
        DDP,
        LONG,
        expect="hang_desync",
        rank=1,
        inject="kill",
        known_gap=(
            "no rule names a dead rank from a trace: hang_desync needs 60 s of silence or diverged "
            "collectives; it fires only when the dead rank's unflushed last 0.2 s leave it >= 2 steps "
            "behind (by chance: not strict)"
        ),
        strict=False,
    ),
    Cell(
        "ZeRO-2",
        "healthy",
        GPT,
        ZERO2,
        known_gap=(
            "a false straggler warning on rank 0 in 2 of 5 runs at a load average of 10-16 on the shared "
            "2-core machine (10 steps; the rule's thresholds were set on a quieter machine): not strict"
        ),
        strict=False,
    ),
    Cell("ZeRO-2", "straggler", GPT, (*ZERO2, *SLOW), expect="straggler", rank=1),
    Cell(
        "ZeRO-2 fp16",
        "overflow storm",
        GPT,
        ("--zero", "2", "--dtype", "fp16", "--steps", "14", "--overflow-at", "3,4,5,6,7,8,9,10"),
        expect="overflow_storm",
    ),
    Cell("ZeRO-3", "healthy", GPT, ("--zero", "3", "--steps", "8")),
    Cell("megatron-core TP=2", "healthy", MEGATRON, TP_ARGS),
    Cell("megatron-core TP=2", "straggler", MEGATRON, (*TP_ARGS, *SLOW), expect="straggler", rank=1),
    Cell("megatron-core TP=2", "hang", MEGATRON, LONG, expect="hang_desync", rank=1, inject="stop"),
)


@dataclass
class Outcome:
    """What diag said about one cell."""

    cell: Cell
    findings: list[Finding] = field(default_factory=list)  # post-mortem, warning or critical
    live: str | None = None  # `diag stacks` verdict (a hang)
    live_s: float | None = None  # seconds from the injection to that verdict
    note: str = ""

    def found(self) -> Finding | None:
        """The expected finding, naming the right rank, if diag made it post-mortem (a hang: not
        required, `diag stacks` is the live verdict; a SIGKILL that ends a hung job loses each rank's
        last 0.2 s of records, and the rule needs 60 s of silence or diverged collectives)."""
        for f in self.findings:
            if f.rule == self.cell.expect and (self.cell.rank is None or self.cell.rank in f.ranks):
                return f
        return None

    def live_correct(self) -> bool:
        """A hang (a stopped rank): `diag stacks` names it as the rank that never arrived."""
        return self.cell.inject != "stop" or f"never arrived: rank {self.cell.rank}" in (self.live or "")

    def false_alarms(self) -> list[str]:
        return sorted(
            {f"{f.rule} ({f.severity}, ranks {f.ranks})" for f in self.findings if f.rule != self.cell.expect}
        )

    def correct(self) -> bool:
        if self.cell.expect is None:
            return not self.findings
        post = self.found() is not None or self.cell.inject == "stop"
        return post and self.live_correct() and not self.false_alarms()

    def row(self) -> dict[str, Any]:
        f = self.found()
        c = self.cell
        expected = f"{c.expect or 'nothing'}" + (f" naming rank {c.rank}" if c.rank is not None else "")
        if c.inject == "stop":
            expected = f"`diag stacks`: rank {c.rank} never arrived (post-mortem {c.expect} allowed)"
        return {
            "job": c.job,
            "fault": c.fault,
            "expected": expected,
            "post_mortem": ", ".join(sorted({x.rule for x in self.findings})) or "nothing",
            "severity": f.severity if f is not None else None,
            "named_ranks": f.ranks if f is not None else None,
            "live_asked": c.inject == "stop",
            "live": self.live,
            "live_s": None if self.live_s is None else round(self.live_s, 1),
            "false_alarms": self.false_alarms(),
            "correct": self.correct(),
            "known_gap": self.cell.known_gap,
            "note": self.note,
        }


def alarms(trace_dir: str) -> list[Finding]:
    findings, failures = run_all(diag.load(trace_dir))
    assert failures == {}, failures
    return [f for f in findings if f.severity in ALARM]


def run_cell(cell: Cell, runs: Runs, folder: str) -> Outcome:
    """Run one cell (a planted-in-the-job fault through the shared run cache)."""
    if cell.inject is None:
        job = runs.get(cell.module, list(cell.args), diag=True)
        assert job.trace_dir is not None
        return Outcome(cell, alarms(job.trace_dir))
    return _run_injected(cell, folder)


def _follow(job: subprocess.Popen[str], seen: list[int], lines: list[str]) -> None:
    assert job.stdout is not None
    for line in job.stdout:
        lines.append(line)
        if "iteration " in line:
            with contextlib.suppress(ValueError):
                seen.append(int(line.rsplit("iteration ", 1)[1]))


def _run_injected(cell: Cell, folder: str) -> Outcome:
    """Start the job with the agent in-process, plant the fault from outside on `cell.rank` once it
    trains, read `diag stacks` live (a hang), then end the job and analyze its trace."""
    os.makedirs(folder, exist_ok=True)
    trace = os.path.join(folder, "trace")
    env = {"XDG_RUNTIME_DIR": folder}
    job = launch.popen(
        cell.module,
        [
            *cell.args,
            "--log-iterations",
            "--diag",
            "--trace-dir",
            trace,
            "--out",
            os.path.join(folder, "result.json"),
        ],
        env=env,
    )
    seen: list[int] = []
    lines: list[str] = []
    threading.Thread(target=_follow, args=(job, seen, lines), daemon=True).start()
    out = Outcome(cell)
    pids: dict[int | None, int] = {}
    try:
        deadline = time.monotonic() + 180
        while not seen or max(seen) < INJECT_AFTER:
            assert job.poll() is None, "the job exited before the fault:\n" + "".join(lines[-30:])
            assert time.monotonic() < deadline, "the job never trained"
            time.sleep(0.1)
        pids = {rank: pid for pid, rank in ranks_under(job.pid)}
        t0 = time.monotonic()
        assert cell.rank is not None
        os.kill(pids[cell.rank], signal.SIGSTOP if cell.inject == "stop" else signal.SIGKILL)
        if cell.inject == "stop":
            time.sleep(STACKS_AFTER)
            res = subprocess.run(
                [sys.executable, "-m", "diag", "stacks", str(job.pid), "--json"],
                capture_output=True,
                text=True,
                cwd=launch.ROOT,
                timeout=90,
                env=launch.job_env(env),
            )
            out.live_s = time.monotonic() - t0
            out.live = (
                json.loads(res.stdout).get("verdict")
                if res.returncode == 0
                else f"exit {res.returncode}: {res.stderr.strip()[-300:]}"
            )
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.wait(timeout=120)  # the peers fail in their next collective; torchrun ends
            out.note = f"job exit {job.poll()}"
    finally:
        for pid in [job.pid, *pids.values()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.wait()
    out.findings = alarms(trace)
    return out


def render(rows: list[dict[str, Any]]) -> str:
    """The matrix as a markdown table."""
    head = (
        "| job | fault | expected | post-mortem (`diag analyze`) | live (`diag stacks`) | "
        "false alarms | correct |\n|---|---|---|---|---|---|---|\n"
    )
    body = []
    for r in rows:
        live = (
            "—" if not r["live_asked"] else f"{r['live'] or 'no verdict'} ({r['live_s']} s after the fault)"
        )
        post = r["post_mortem"]
        if r["severity"]:
            post += f" ({r['severity']}, ranks {r['named_ranks']})"
        gap = f": {r['known_gap']}" if r["known_gap"] else ""
        ok = ("yes" + (f", by chance{gap}" if gap else "")) if r["correct"] else "**no**" + gap
        body.append(
            f"| {r['job']} | {r['fault']} | {r['expected']} | {post} | {live} | "
            f"{', '.join(r['false_alarms']) or 'none'} | {ok} |"
        )
    return head + "\n".join(body) + "\n"
