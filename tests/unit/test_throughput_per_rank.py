"""Samples/s per rank and for the job (issue: on a 2-rank ZeRO-3 job each rank showed the job's
28.3 samples/s as its own; per rank it is 14.2). A DeepSpeed step record's `samples` is the
engine's global_samples delta: micro batch x gradient accumulation x DP, the global batch."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

import diag
from diag.cli import main
from diag.metrics import throughput

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZERO3 = os.path.join(ROOT, "sample_traces", "zero3")  # a real 2-rank ZeRO-3 run (generate.py)


def _analyze(capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["analyze", ZERO3, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_ranks_samples_per_s_is_its_replicas_share(capsys: pytest.CaptureFixture[str]) -> None:
    trace = diag.load(ZERO3)
    cfg = trace.layout()["ds_config"]
    replica = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]  # 4
    dp = trace.layout()["dp"]
    assert set(trace.steps["samples"].dropna()) == {replica * dp}  # the global batch on every rank
    tp = _analyze(capsys)["throughput"]
    assert len(tp["per_rank"]) == 2
    for r in tp["per_rank"]:
        # the rank's samples per step: its replica's micro x accumulation, not the global batch
        assert r["samples_per_s"] * r["step_ms"] / 1e3 == pytest.approx(replica, rel=0.02)
    job_s = throughput.job_step_s(pd.DataFrame(tp["per_step"]))
    assert job_s and tp["measured"]["samples_per_s"] * job_s == pytest.approx(replica * dp, rel=0.02)


def test_the_steps_table_shows_the_jobs_rate(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _analyze(capsys)
    st = diag.load(ZERO3).steps
    slow = st.groupby("step")["dur"].max()
    batch = st["samples"].dropna().iloc[0]
    assert doc["steps"]
    for row in doc["steps"]:
        assert row["samples_per_s"] == pytest.approx(batch / (slow[row["step"]] / 1e9))
