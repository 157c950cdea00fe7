"""`diag attach` to a plain torchrun DDP job mid-run: diag's step numbers are the program's own
iteration on every rank (issue 17: they were counted from the attach, 62 below the printed
iteration, and the two ranks one apart)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import diag
from tests.conftest import ROOT
from tests.integration.runs import DDP
from tests.workloads import launch

pytestmark = pytest.mark.slow
STEPS, SLEEP = 400, 0.03
ARGS = ["--steps", str(STEPS), "--step-sleep", str(SLEEP), "--log-iterations"]


def _follow(job: subprocess.Popen[str], seen: list[int]) -> None:
    """Collect the iterations the job prints (torchrun prefixes each line with its rank)."""
    assert job.stdout is not None
    for line in job.stdout:
        if "iteration " in line:
            seen.append(int(line.rsplit("iteration ", 1)[1]))


def test_attached_steps_carry_the_programs_iteration(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    out, trace = str(tmp_path / "result.json"), str(tmp_path / "trace")
    job = launch.popen(DDP, [*ARGS, "--out", out], env=env)
    printed: list[int] = []
    threading.Thread(target=_follow, args=(job, printed), daemon=True).start()
    diag_env = {**os.environ, **env}
    try:
        deadline = time.monotonic() + 180
        while not printed or max(printed) < 30:  # well into training: the attach is mid-run
            assert job.poll() is None and time.monotonic() < deadline, "the job never trained"
            time.sleep(0.1)
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "diag",
                "attach",
                str(job.pid),
                "--what",
                "steps,comms",
                "--trace-dir",
                trace,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=diag_env,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        time.sleep(1.5)
        det = subprocess.run(
            [sys.executable, "-m", "diag", "detach", str(job.pid)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=diag_env,
            timeout=60,
        )
        assert det.returncode == 0, det.stderr
        assert job.wait(timeout=180) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    with open(out) as f:
        result = json.load(f)
    tr = diag.load(trace)
    for rank in (0, 1):
        assert tr.headers[rank].get("step_origin") == "loop:step"
        ends = result["ranks"][rank]["step_ends"]  # wall clock right after the job's iteration i
        steps = tr.steps[(tr.steps["rank"] == rank) & tr.steps["dur"].notna()]
        assert len(steps) >= 5, len(steps)
        assert int(steps["step"].min()) > 30  # attached mid-run: a count from attach starts at 0
        for _, s in steps.iterrows():
            end = int(s["ts"] + s["dur"])
            nearest = min(range(len(ends)), key=lambda i: abs(ends[i] - end))
            assert abs(ends[nearest] - end) < SLEEP * 1e9 / 3, (rank, s["step"], nearest)
            assert int(s["step"]) == nearest, (rank, int(s["step"]), nearest)
        # the step each all-reduce carries is the iteration in progress when it ran
        comms = tr.comms[(tr.comms["rank"] == rank) & (tr.comms["op"].astype(str) == "all_reduce")]
        for _, c in comms.iterrows():
            after = [i for i, e in enumerate(ends) if e >= c["ts"]]
            if after and int(c["step"]) != 0:
                assert int(c["step"]) == after[0], (rank, int(c["step"]), after[0])
