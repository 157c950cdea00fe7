"""Attach safety: 50 attach/detach cycles on both ranks of a running 2-rank DeepSpeed job leave it
training, with losses bit-identical to an untouched run and nothing left behind (threads, file
descriptors, global and per-module hooks, wrapped functions: checked from inside each rank)."""

from __future__ import annotations

import glob
import json
import os
import statistics
import subprocess
import sys

import pytest

from diag.trace.reader import read_file
from tests.reliability import jobs
from tests.workloads import launch

pytestmark = pytest.mark.slow
CYCLES = 50
SEED = 20240
CYCLES_TIMEOUT_S = 150  # a hang is told from a slow machine by time alone (here 76 s, 84 s since a
# detach waits for the training thread to pop the FLOP counter: every step is sampled at layers_every 1)


def test_fifty_attach_detach_cycles(tmp_path, baseline, runtime_env) -> None:
    held = jobs.start(str(tmp_path / "job"), env=runtime_env)
    trace = str(tmp_path / "trace")
    try:
        first = held.wait_steps(1)
        held.ranks()
        try:
            cyc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tests.reliability.cycler",
                    str(held.proc.pid),
                    trace,
                    str(CYCLES),
                    str(SEED),
                ],
                capture_output=True,
                text=True,
                env=launch.job_env(runtime_env),
                cwd=launch.ROOT,
                timeout=CYCLES_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:  # the old GIL-taking injector hung here after 3-39 attaches
            done = len(glob.glob(os.path.join(trace, "rank-*.jsonl")))
            pytest.fail(f"an attach hung after {done} injections (a rank deadlocked?)")
        assert cyc.returncode == 0, cyc.stderr[-3000:]
        summary = json.loads(cyc.stdout.splitlines()[-1])
        assert held.proc.poll() is None, held.output()
        assert held.steps() > first, "the job did not train during the cycles"
        held.wait_steps(held.steps() + 2)  # modes parked on the training thread unwind (layers.py)
        result = held.finish()
    finally:
        held.kill()
    lat = summary["latencies"]
    print(
        f"\n{CYCLES} cycles over {len(result['losses'])} steps via {summary['methods']}; attach "
        f"both ranks: median {statistics.median(lat):.3f} s, max {max(lat):.3f} s"
    )
    jobs.assert_same_training(result, baseline)
    jobs.assert_clean(result, baseline)
    files = glob.glob(os.path.join(trace, "rank-*.jsonl"))
    assert len(files) == 2 * CYCLES  # one fresh file per attach, never appended to an old one
    for path in files:
        header, _, problems = read_file(path)
        assert header is not None and problems == [], (path, problems)
