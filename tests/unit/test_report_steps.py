"""The report's step count is the job's: every step recorded, with how many of them are timed (a
trace's first step has no earlier boundary, so no duration: 51,199 of the public DDP tutorial's
51,200 iterations were timed, and the summary said '51199 steps')."""

from __future__ import annotations

import os

from diag.analyzers import run_all

from diag.importers import load_inputs
from diag.metrics.stage import Metrics
from diag.report import model
from diag.report.tables import summary_line
from diag.trace.reader import load_trace
from tests.conftest import ROOT


def test_the_summary_counts_every_recorded_step_and_says_how_many_are_timed():
    trace = load_trace(os.path.join(ROOT, "sample_traces", "healthy"))
    metrics = Metrics(trace)
    doc = model.build(trace, *run_all(trace, metrics=metrics), metrics)
    steps = doc["summary"]["steps"]
    assert (steps["recorded"], steps["count"]) == (8, 7)  # steps 0-7; step 0 has no duration
    assert "8 steps (7 timed), median" in summary_line(doc)


def test_flop_rates_are_per_rank_on_cpu_ranks_and_per_gpu_on_gpus():
    """The demo and CPU jobs ran on no GPU: their FLOP/s are per rank; a GPU trace's per GPU."""
    per = {}
    for name in ("healthy", "hta_dlrm_8rank"):
        trace = load_inputs([os.path.join(ROOT, "sample_traces", name)])
        metrics = Metrics(trace)
        doc = model.build(trace, *run_all(trace, metrics=metrics), metrics)
        per[name] = (doc["throughput"]["per"], summary_line(doc))
    assert per["healthy"][0] == "rank" and "FLOP/s per rank" in per["healthy"][1]
    assert per["hta_dlrm_8rank"][0] == "GPU"


def _log_doc(name: str) -> dict:
    trace = load_inputs([os.path.join(ROOT, "tests", "fixtures", "logs", name)])
    metrics = Metrics(trace)
    return model.build(trace, *run_all(trace, metrics=metrics), metrics)


def test_a_log_alone_fills_the_steps_from_its_iterations():
    """`diag analyze LOG --json` had an empty `steps` list while its summary counted the log's
    iterations: each timed iteration is a row, as a trace's step is (a real Megatron-DeepSpeed
    TP=2 PP=2 log whose first two iterations were skipped for fp16 overflow)."""
    doc = _log_doc("megatron_deepspeed_tp2_pp2.log")
    rows = doc["steps"]
    assert len(rows) == doc["summary"]["steps"]["count"] == 6
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["applied"] for r in rows] == [False, False, True, True, True, True]
    assert rows[1]["max_ms"] == rows[1]["min_ms"] == 1420.9 and rows[0]["sampled"] is False
    assert rows[0]["samples_per_s"] == 2.852


def test_a_skip_in_a_logging_interval_is_not_pinned_on_the_logged_iteration():
    """Megatron-LM logging every 10 iterations counts the interval's skips: which iteration it was
    is unknown, so the logged row's `applied` is None, not False."""
    rows = _log_doc("megatron_lm_fp16.log")["steps"]
    assert [(r["step"], r["applied"]) for r in rows] == [(10, None), (20, True), (30, None)]
    assert [r["tflops"] for r in rows] == [143.6, 151.2, 149.4]
