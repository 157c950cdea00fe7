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
