"""The agent's promises under failure: a collector that raises never reaches the training loop, and a
rank killed with SIGKILL leaves a trace that loads up to its last flushed event."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from diag import load
from diag.agent import ALL_COLLECTORS
from tests.integration.runs import DS_COMMON, GPT, ZERO2_FP16, Job, Runs
from tests.workloads import launch

pytestmark = pytest.mark.slow

# ZeRO-2 fp16 with one overflow: test_agent_deepspeed's run, so the run without the agent is shared
ARGS = [*ZERO2_FP16, *DS_COMMON]
# memory samples at step boundaries, which a faulting steps collector never reports: the second
# set leaves steps alone so that memory's hook runs (and fails) too
FAULT_SETS = {
    "all": set(ALL_COLLECTORS),
    "all-but-steps": set(ALL_COLLECTORS) - {"steps"},
}


def injected(job: Job, rank: int) -> set[str]:
    """Collectors whose hooks raised the injected fault on this rank (counted, count > 0)."""
    err = job.trace.errors
    mine = err[(err["rank"] == rank) & (err["exc"].astype(str) == "InjectedFault")]
    assert (mine["count"] > 0).all()
    return set(mine["collector"].astype(str))


@pytest.mark.parametrize("faults", sorted(FAULT_SETS))
def test_collector_faults_stay_out_of_training(runs: Runs, faults: str) -> None:
    spec = ",".join(f"{c}=raise" for c in sorted(FAULT_SETS[faults]))
    faulty = runs.get(GPT, ARGS, diag=True, env={"DIAG_FAULTS": spec})
    clean = runs.get(GPT, ARGS, diag=False)
    for r in range(2):
        assert faulty.rank(r)["losses"] == clean.rank(r)["losses"]
        assert faulty.rank(r)["skipped_steps"] == clean.rank(r)["skipped_steps"] == 1
        expected = FAULT_SETS[faults] - ({"memory"} if "steps" in FAULT_SETS[faults] else set())
        assert injected(faulty, r) == expected


def _wait_for_steps(path: str, n: int, proc: subprocess.Popen[str], timeout: float) -> dict[str, object]:
    """Wait until `path` holds n step records; return its header."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "job exited early"
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
            steps = sum('"k":"step"' in line for line in lines)
            if steps >= n:
                return json.loads(lines[0])
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps in {path} after {timeout}s")


def test_sigkill_leaves_a_loadable_trace(tmp_path: Path) -> None:
    trace_dir = str(tmp_path / "trace")
    proc = launch.popen(GPT, ["--steps", "1000", "--step-sleep", "0.05", "--diag", "--trace-dir", trace_dir])
    try:
        header = _wait_for_steps(os.path.join(trace_dir, "rank-00001.jsonl"), 3, proc, 120)
        os.kill(header["pid"], signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    trace = load(trace_dir)
    assert trace.headers[1]["pid"] == header["pid"]
    steps = trace.steps
    killed = steps[steps["rank"] == 1]
    # DeepSpeed's own numbers (global_steps once taken): from 1
    assert len(killed) >= 3 and sorted(killed["step"]) == list(range(1, len(killed) + 1))
    assert all(p.truncated for p in trace.problems), [str(p) for p in trace.problems]
