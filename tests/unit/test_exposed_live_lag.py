"""Followed live, one rank's records run a few steps ahead of another's (each rank's writer flushes
on its own); a collective whose peer record is not in yet has no known transfer time, and its step is
left out of the exposed-communication figures rather than counted as all transfer.

Fixture zero2_start: the first 12 steps of a real healthy DeepSpeed ZeRO-2 job (tests/workloads/gpt_ds.py,
2 ranks, gloo) under the fault matrix's harness, where `diag watch --json` printed "44% of each step
waits on communication (rank 1)" (critical) 4.7 s before any fault: rank 1's records were ahead."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from diag.analyzers import registered_rules

import diag
from diag.metrics import comms
from diag.metrics.stage import Metrics
from diag.trace.model import Trace
from tests.conftest import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "zero2_start")


def _as_live(trace: Trace, last: dict[int, int]) -> Trace:
    """The trace as a watcher had it when each rank had written up to its step in `last`."""
    frames = {}
    for kind, df in trace.frames.items():
        if "step" in df and "rank" in df:
            step = pd.to_numeric(df["step"], errors="coerce")
            frames[kind] = df[step.isna() | (step <= df["rank"].map(last))]
        else:
            frames[kind] = df
    return Trace(headers=trace.headers, frames=frames, sources=trace.sources)


def _exposed(trace: Trace) -> list:
    return registered_rules()["exposed_comm"][0](trace)


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_rank_ahead_of_its_peer_is_not_read_as_exposed(ahead):
    trace = diag.load(FIXTURE)
    for lead in range(1, 4):
        last = {ahead: 7 + lead, 1 - ahead: 7}
        assert _exposed(_as_live(trace, last)) == [], last


def test_its_unmatched_collectives_have_no_transfer_time():
    live = _as_live(diag.load(FIXTURE), {0: 7, 1: 10})
    c = Metrics(live).comms
    xfer = comms.transfer_dur(c)
    ahead = c["rank"].eq(1) & (c["step"] > 7)
    assert xfer[ahead].isna().all() and xfer[~ahead].notna().all()


def test_without_that_the_leading_rank_reads_as_exposed(monkeypatch):
    """The old reading (the minimum over whichever members are in) fires on the same view."""

    def over_present(c: pd.DataFrame, at: object = None) -> pd.Series:
        key = c["group"].astype(str)
        k = pd.DataFrame({"ts": c["ts"]}).sort_values("ts").groupby([c["rank"], key]).cumcount()
        frame = pd.DataFrame({"g": key, "k": k.reindex(c.index), "dur": pd.to_numeric(c["dur"])})
        return frame.groupby(["g", "k"])["dur"].transform("min")

    monkeypatch.setattr(comms, "transfer_dur", over_present)
    (f,) = _exposed(_as_live(diag.load(FIXTURE), {0: 7, 1: 10}))
    assert f.ranks == [1]
