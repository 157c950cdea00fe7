"""A diag trace and the job's log, analyzed together, line up by the framework's iteration number and
each step counts once (tests/fixtures/join: one real 2-rank DeepSpeed fp16 run, see its README)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from diag.importers import load_inputs
from diag.importers.join import shift
from tests.unit.kineto_samples import ROOT

JOIN = os.path.join(os.path.dirname(__file__), "..", "fixtures", "join")
LOG = os.path.join(JOIN, "job.log")


def _joined(*paths: str):
    return load_inputs(list(paths)).frame("step_join").set_index("step")


def test_trace_and_log_name_the_same_iterations():
    j = _joined(JOIN, LOG)
    assert j.index.tolist() == list(range(1, 13)) and j["in_trace"].all() and j["in_log"].all()
    assert (j["ranks"] == 2).all() and (j["log_shift"] == 0).all()
    timed = j.dropna(subset=["trace_ms", "log_ms"])
    assert len(timed) == 11  # step 1 has no previous boundary in either source
    assert (timed["trace_ms"] - timed["log_ms"]).abs().max() < 15
    assert j.loc[3, "samples_per_sec"] == pytest.approx(12.987345, abs=1e-6)


def test_each_overflow_counts_once_across_trace_ranks_and_log():
    trace = load_inputs([JOIN, LOG])
    ov = trace.overflow
    assert int(ov["overflow"].astype(bool).sum()) == 6  # 2 steps x (2 trace ranks + the log)
    j = trace.frame("step_join").set_index("step")
    assert j.index[j["overflow"]].tolist() == [5, 6]


def test_a_log_numbered_one_behind_is_shifted_onto_the_trace(tmp_path):
    """An older numbering (the log says N-1 for the trace's N) is found by the step times."""
    text = open(LOG).read()

    text = re.sub(r"step=(\d+), skipped", lambda m: f"step={int(m.group(1)) - 1}, skipped", text)
    text = re.sub(r"global_step=(\d+),", lambda m: f"global_step={int(m.group(1)) - 1},", text)
    (tmp_path / "job.log").write_text(text)
    j = _joined(JOIN, str(tmp_path / "job.log"))
    assert (j["log_shift"] == 1).all()
    timed = j.dropna(subset=["trace_ms", "log_ms"])
    # the log's first step (its `step=0`, shifted to 1) has no time before it: steps 3-12 are timed
    assert timed.index.tolist() == list(range(3, 13))
    assert (timed["trace_ms"] - timed["log_ms"]).abs().max() < 15
    assert j.index[j["overflow"]].tolist() == [5, 6]


def test_no_shift_without_a_clear_winner():
    import pandas as pd

    flat = pd.Series([500.0] * 8, index=range(1, 9))
    assert shift(flat, flat) == 0  # every shift fits a constant series equally: keep the numbers


def test_the_report_carries_the_joined_steps(tmp_path):
    shutil.copy(LOG, tmp_path / "job.log")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    r = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", JOIN, str(tmp_path / "job.log"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = doc["metrics"]["steps_joined"]
    assert [x["step"] for x in rows] == list(range(1, 13)) and sum(x["overflow"] for x in rows) == 2
    assert doc["summary"]["steps"]["count"] == 11


def test_a_log_alone_or_a_trace_alone_has_no_join():
    assert load_inputs([LOG]).frame("step_join").empty and load_inputs([JOIN]).frame("step_join").empty
