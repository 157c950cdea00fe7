"""The collectives are placed among their groups' calls once per analysis (`Metrics.placement`),
and every reader of positions shares that placement: the straggler rule alone placed every call up
to three times (`metrics.exposed`, its async tail, `metrics.stragglers`), each at 50-60 bytes a
call at its peak (docs/scale.md). Shared, each reader must give what placing the calls anew gives,
on every diag trace among the samples and fixtures."""

from __future__ import annotations

import os

import numpy as np
import pytest
from diag.analyzers import collective_mismatch as cm
from diag.analyzers import run_all

import diag
from diag.importers import load_inputs
from diag.metrics import breakdown, comms, positions
from diag.metrics.stage import Metrics
from tests.conftest import ROOT, sample_folders

DIAG_DIRS = [d for d in sample_folders() if any(f.endswith(".jsonl") for f in os.listdir(d))]


def test_an_analysis_places_the_calls_once(monkeypatch):
    trace = diag.load(os.path.join(ROOT, "tests", "fixtures", "zero2_start"))
    metrics = Metrics(trace)
    placed: list[int] = []
    real = positions.in_step

    def counted(c, ts):
        placed.append(len(c))
        return real(c, ts)

    monkeypatch.setattr(positions, "in_step", counted)
    _, failures = run_all(trace, metrics=metrics)
    assert not failures, failures
    assert not metrics.stragglers.empty  # (the report's table read the placement too)
    assert placed == [len(metrics.comms)]


@pytest.mark.parametrize("path", DIAG_DIRS, ids=os.path.basename)
def test_the_shared_placement_gives_what_placing_anew_gives(path):
    trace = load_inputs([path], slim=True)
    metrics = Metrics(trace)
    c = metrics.comms
    at = metrics.placement
    for measure in (comms.transfer_dur, comms.arrival_wait):
        assert measure(c, at).equals(measure(c)), measure.__name__
    assert metrics.stragglers.equals(breakdown.stragglers(trace))
    if c.empty or "group" not in c:
        return
    shared, counted = cm._compared(trace, metrics, c), cm._compared(trace, metrics, c.copy())
    assert np.array_equal(shared.rows, counted.rows) and np.array_equal(shared.k, counted.k)
