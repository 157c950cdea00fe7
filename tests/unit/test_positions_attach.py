"""Calls are matched across ranks within their group and step. Counted over the whole trace, one
call more on one rank (an attach lands mid-step, each rank's agent at its own point) paired every
later call with the wrong one: on the real Megatron-DeepSpeed `pretrain_gpt.py` attached mid-run,
53% of the TP group's positions paired calls of different sizes, and every transfer time and
arrival wait after the attach was wrong.

Fixture zero2_start: the first 12 steps of a real healthy DeepSpeed ZeRO-2 job (2 ranks, gloo)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

import diag
from diag.metrics import breakdown, comms
from diag.metrics.stage import Metrics
from diag.trace.model import Trace
from tests.conftest import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "zero2_start")


def _attached_late(trace: Trace, rank: int, calls: int) -> Trace:
    """The trace as if `rank`'s agent had started `calls` collectives later than its peer's."""
    c = trace.frames["comm"]
    mine = c.index[c["rank"] == rank]
    first = c.loc[mine].sort_values("ts", kind="stable").index[:calls]
    return Trace(
        headers=trace.headers, frames={**trace.frames, "comm": c.drop(index=first)}, sources=trace.sources
    )


def test_a_call_missed_at_attach_shifts_no_later_match():
    whole = diag.load(FIXTURE)
    late = _attached_late(whole, rank=0, calls=1)
    ref, got = Metrics(whole).comms, Metrics(late).comms
    first = int(pd.to_numeric(got["step"]).min())
    after = got.index[pd.to_numeric(got["step"]) > first]  # the steps both ranks recorded whole
    for measure in (comms.transfer_dur, comms.arrival_wait):
        a, b = measure(ref).loc[after], measure(got).loc[after]
        # ns, within 1 us: a trace with unplaced calls holds the latest start as a float
        assert np.allclose(a.to_numpy(float), b.to_numpy(float), atol=1e3, equal_nan=True), measure.__name__
    cut = got.index[pd.to_numeric(got["step"]) == first]  # the cut step: its calls pair with none
    assert comms.transfer_dur(got).loc[cut].isna().all()


def test_whole_steps_match_as_before():
    """No call missed: every call keeps the transfer time the whole-trace count gave."""
    c = Metrics(diag.load(FIXTURE)).comms
    xfer = comms.transfer_dur(c)
    assert xfer.notna().mean() > 0.9


def test_last_arrivals_are_placed_within_group_and_step():
    """The report's "last to arrive" share pairs calls as transfer_dur does: a call missed at
    attach on one rank shifted every later pairing (each rank's k-th call over its whole trace).
    Placed within group and step, only the cut step's calls pair with none."""
    whole = diag.load(FIXTURE)
    late = _attached_late(whole, rank=0, calls=1)
    c = whole.frames["comm"]
    cut = int(pd.to_numeric(late.frames["comm"].loc[lambda d: d["rank"] == 0, "step"]).min())
    ref_trace = Trace(
        headers=whole.headers,
        frames={**whole.frames, "comm": c[pd.to_numeric(c["step"]) != cut]},
        sources=whole.sources,
    )
    ref = breakdown.stragglers(ref_trace).set_index("rank")["last_arrival_frac"]
    got = breakdown.stragglers(late).set_index("rank")["last_arrival_frac"]
    assert ref.sum() == pytest.approx(1.0, abs=0.01)  # one rank arrives last at each position
    assert got.to_dict() == ref.to_dict()
