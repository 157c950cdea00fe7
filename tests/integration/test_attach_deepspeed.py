"""Attach to the torchrun launcher of a real 2-rank DeepSpeed ZeRO-3 job that has no diag in it:
events from both ranks reach the trace within 2 s, detach, and the job's losses equal an untouched
run's, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from diag.errors import DiagError
from diag.procs import ranks_under
from diag.stacks.dump import dump, rank_stack
from tests.conftest import ROOT
from tests.integration.runs import GPT
from tests.workloads import launch

pytestmark = pytest.mark.slow
STEPS = 40
TRAIN = ["--zero", "3", "--steps", str(STEPS)]
ARGS = [*TRAIN, "--step-sleep", "0.1"]  # the attached job's pace: time to attach while it trains
EVENT_KINDS = {"step", "comm", "layer", "memory", "overflow"}


def training(pid: int) -> bool:
    """Both ranks are in the workload's training loop, past engine set-up (py-spy: a `train` frame
    in gpt_ds.py and no `make_engine` frame, which `train` calls first)."""
    ranks = ranks_under(pid)
    if len(ranks) != 2:
        return False
    for rpid, rank in ranks:
        try:
            st = rank_stack(rpid, rank, dump(rpid))
        except DiagError:  # a rank that is still starting (or exiting) can't be read yet: poll on
            return False
        names = {f.name for f in st.frames if f.file.endswith("gpt_ds.py")}
        if "train" not in names or "make_engine" in names:
            return False
    return True


def ranks_with_events(trace_dir: str) -> set[int]:
    seen = set()
    for name in os.listdir(trace_dir) if os.path.isdir(trace_dir) else []:
        with open(os.path.join(trace_dir, name)) as f:
            lines = [json.loads(ln) for ln in f if ln.endswith("\n")]
        if lines and any(e["k"] in EVENT_KINDS for e in lines[1:]):
            seen.add(lines[0]["rank"])
    return seen


def test_attach_to_launcher_traces_both_ranks_and_keeps_losses(runs, tmp_path):
    untouched = runs.get(GPT, TRAIN, diag=False)  # a sleep between steps changes no loss
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    out, trace = str(tmp_path / "result.json"), str(tmp_path / "trace")
    job = launch.popen(GPT, [*ARGS, "--out", out], env=env, stdout=subprocess.DEVNULL)
    diag_env = {**os.environ, **env}
    try:
        deadline = time.monotonic() + 180
        while not training(job.pid):
            assert job.poll() is None, "the job exited before training"
            assert time.monotonic() < deadline, "the job never started training"
            time.sleep(0.3)
        res = subprocess.run(
            [sys.executable, "-m", "diag", "attach", str(job.pid), "-v", "--trace-dir", trace],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=diag_env,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        assert "(rank 0) via" in res.stdout and "(rank 1) via" in res.stdout, res.stdout
        attached = time.monotonic()
        while ranks_with_events(trace) != {0, 1}:
            assert time.monotonic() - attached < 2.0, f"events only from ranks {ranks_with_events(trace)}"
            time.sleep(0.05)
        assert sorted(os.listdir(trace)) == ["rank-00000.jsonl", "rank-00001.jsonl"]  # one agent each
        det = subprocess.run(
            [sys.executable, "-m", "diag", "detach", str(job.pid)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=diag_env,
            timeout=60,
        )
        assert det.returncode == 0 and det.stdout.count("detached from") == 2, det.stderr
        assert job.wait(timeout=180) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    with open(out) as f:
        result = json.load(f)
    assert result["losses"] == untouched.result["losses"]
    assert len(result["losses"]) == STEPS
