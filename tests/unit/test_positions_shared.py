"""The collectives are placed among their groups' calls once per analysis (`Metrics.placement`),
and every reader of positions shares that placement: the straggler rule alone placed every call up
to three times (`metrics.exposed`, its async tail, `metrics.stragglers`), each at 50-60 bytes a
call at its peak (docs/scale.md). Shared, each reader must give what placing the calls anew gives,
on every diag trace among the samples and fixtures."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from diag.analyzers import collective_mismatch as cm
from diag.analyzers import run_all, straggler

import diag
from diag.importers import load_inputs
from diag.metrics import breakdown, comms, positions
from diag.metrics.stage import Metrics
from tests.conftest import ROOT, sample_folders

DIAG_DIRS = [d for d in sample_folders() if any(f.endswith(".jsonl") for f in os.listdir(d))]


def test_a_rule_places_the_calls_once(monkeypatch):
    """The straggler rule's readers (`metrics.exposed`, `metrics.blocked`'s async tail) share one
    placement, dropped when the rule ends (8 bytes a call held under every later rule raised a
    64-rank x 1,000-step trace's peak)."""
    trace = diag.load(os.path.join(ROOT, "tests", "fixtures", "zero2_start"))
    metrics = Metrics(trace)
    placed: list[int] = []
    real = positions.place

    def counted(c, ts=None):
        placed.append(len(c))
        return real(c, ts)

    monkeypatch.setattr(positions, "place", counted)
    _, failures = run_all(trace, only=["straggler"], metrics=metrics)
    assert not failures, failures
    assert placed == [len(metrics.comms)]
    assert metrics.placed is None


def test_a_rule_computes_the_transfer_times_once(monkeypatch):
    """`metrics.exposed` and the async tail (`straggler.async_tail_wait`) read one `transfer_dur`
    of every call (`Metrics.transfer`), dropped with the placement when the rule ends."""
    trace = diag.load(os.path.join(ROOT, "tests", "fixtures", "zero2_start"))
    metrics = Metrics(trace)
    computed: list[int] = []
    real = comms.transfer_dur

    def counted(c, at=None):
        computed.append(len(c))
        return real(c, at)

    monkeypatch.setattr(comms, "transfer_dur", counted)
    monkeypatch.setattr(straggler, "transfer_dur", counted)
    _, failures = run_all(trace, only=["straggler"], metrics=metrics)
    assert not failures, failures
    assert not metrics.exposed.empty and computed == [len(metrics.comms)]
    got = metrics.transfer
    assert got.equals(real(metrics.comms)) and computed == [len(metrics.comms)] * 2
    metrics.end_rule()
    assert metrics.placed is None and metrics.transfer is not got


def test_the_straggler_rules_per_step_table_is_held_for_the_rule_only(monkeypatch):
    """`straggler.compute_per_step` is computed once while the rule runs (its whole-run test and
    its fallbacks read it) and dropped when it ends (held under the report, ~56 bytes a rank-step,
    it was the windowed pass's last stage's high-water mark); a copy of the stage (`settle`'s runs)
    holds its own, never the stage's."""
    import copy
    import weakref

    trace = diag.load(os.path.join(ROOT, "tests", "fixtures", "zero2_start"))
    metrics = Metrics(trace)
    made: list[weakref.ref] = []
    real = straggler._compute_per_step

    def counted(m):
        df = real(m)
        made.append(weakref.ref(df))
        return df

    monkeypatch.setattr(straggler, "_compute_per_step", counted)
    run = copy.copy(metrics)
    assert straggler.compute_per_step(run) is straggler.compute_per_step(run) and len(made) == 1
    assert metrics._for_rule is None  # (the copy's own dict)
    run.end_rule()
    assert made[0]() is None  # nothing else holds it
    _, failures = run_all(trace, only=["straggler"], metrics=metrics)
    assert not failures, failures
    assert len(made) == 2 and made[1]() is None


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


@pytest.mark.parametrize("path", DIAG_DIRS, ids=os.path.basename)
def test_the_placement_pairs_the_calls_a_groupby_pairs(path):
    """`positions.place` on integer codes against the plainest reading: each rank's calls of a
    (group, step) numbered in time order, a (group, step) placed where every rank in it made as
    many calls, and one id per (group, step, k) placed."""
    c = Metrics(load_inputs([path], slim=True)).comms
    if c.empty:
        return
    at = positions.place(c)
    ref = pd.DataFrame(
        {
            "g": c["group"].astype(object),
            "s": pd.to_numeric(c["step"]).fillna(-1),
            "r": c["rank"],
            "ts": positions.numbers(c["ts"]),
            "k": at.k,
            "id": at.ids,
        }
    ).dropna(subset=["g"])
    k = ref.sort_values("ts", kind="stable").groupby(["r", "g", "s"]).cumcount()
    assert (ref["k"] == k.reindex(ref.index)).all()
    even = ref.groupby(["g", "s", "r"]).size().groupby(["g", "s"]).nunique() == 1
    placed = pd.MultiIndex.from_frame(ref[["g", "s"]]).isin(even.index[even])
    assert ((ref["id"] >= 0) == placed).all()
    ids = ref[placed]
    assert (ids.groupby(["g", "s", "k"])["id"].nunique() == 1).all()
    assert (ids.groupby("id")[["g", "s", "k"]].nunique() == 1).all().all()
    assert at.count == ids["id"].nunique()
    members = ref.groupby("g")["r"].nunique()
    assert (at.need[ids["id"].to_numpy()] == ids["g"].map(members).to_numpy()).all()
