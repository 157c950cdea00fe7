"""A short real run's top-layers table is a steady step's, not the warm-up's: megatron-core TP=2,
13 steps at the default --layers-every 50 (Megatron-LM's run_simple_mcore_train_loop.py, 12 steps,
sampled step 0 alone: rank 0's embedding forward 115.7 ms, 111.6 of them in its first all_reduce)."""

from __future__ import annotations

import pytest

from diag.metrics.stage import Metrics
from diag.report import trace_doc
from diag.report.trace_tables import layers_table
from tests.integration.runs import MEGATRON, Runs

pytestmark = pytest.mark.slow


def test_a_short_run_samples_its_first_steady_step_and_reports_it(runs: Runs) -> None:
    job = runs.get(MEGATRON, ["--steps", "13"], diag=True)  # test_agent_megatron's run, once a session
    trace = job.trace
    layers, steps = trace.layers, trace.steps
    for rank in range(2):
        first = int(steps[steps["rank"] == rank]["step"].min())
        assert set(layers[layers["rank"] == rank]["step"]) == {first, first + 2}, rank
    steady = Metrics(trace).steady_steps
    assert first + 2 in set(steady[steady["rank"] == 0]["step"])  # the analysis counts it steady
    rows = trace_doc.layers(trace, None, steady)
    assert rows and not any(r["warmup"] for r in rows) and {r["steps"] for r in rows} == {1}
    ((title, _, _),) = layers_table({"layers": rows})
    assert "mean of 1 steady sampled step" in title, title
