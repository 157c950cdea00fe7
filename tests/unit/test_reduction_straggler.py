"""The straggler rule's and the idle gaps' reductions (`analyzers.straggler`, `diag.metrics.idle`)
are the same computed a window of steps at a time and merged as on the whole trace; and the rules,
reading the merged ones, find what they find on the whole trace."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from analyzers.idle_between_steps import idle_between_steps
from analyzers.straggler import ArrivalCalls, ArrivalWaits, CommRanks, TailWait, straggler
from diag.metrics import idle, window_metrics
from diag.metrics.stage import Metrics
from diag.trace.reader import load_trace
from tests.unit.test_reduction import _series
from tests.unit.windowing import assert_windowed, diag_folders, windows

# where the rules fire (straggler, straggler_onset, pp2_starved; input_stall), collectives in the
# idle gaps (repro_idle_is_collectives), and one of each other shape
SHAPES = {"straggler", "straggler_onset", "input_stall", "repro_idle_is_collectives", "healthy_blip", "zero3"}
SHAPES |= {"megatron_tp2", "pp2_noisy_steps", "ddp_contention", "pp2_starved"}
FOLDERS = [d for d in diag_folders() if os.path.basename(d) in SHAPES]
REDUCTIONS = (TailWait(), ArrivalWaits(), CommRanks(), ArrivalCalls(), idle.Idle())


@pytest.mark.parametrize("folder", FOLDERS, ids=os.path.basename)
def test_reductions_merge_to_the_whole(folder):
    trace = load_trace(folder)
    assert_windowed(trace, TailWait(), _series)
    assert_windowed(trace, ArrivalWaits(), _series)
    assert_windowed(trace, CommRanks())
    assert_windowed(trace, ArrivalCalls(), _same_calls)
    assert_windowed(trace, idle.Idle(), _same_idle(Metrics(trace).steps))


@pytest.mark.parametrize("folder", FOLDERS, ids=os.path.basename)
def test_the_rules_find_the_same_on_merged_windows(folder):
    """Windows of one step (seven on a long job), each reduction merged: the same findings."""
    trace = load_trace(folder)
    whole = Metrics(trace)
    want = straggler(trace, whole) + idle_between_steps(trace, whole)
    merged = Metrics(trace)
    context = window_metrics.Whole.of(merged)
    size = 7 if merged.steps["step"].nunique() > 40 else 1
    parts = windows(trace, size)
    for r in REDUCTIONS:
        merged._reduced[r] = window_metrics.merged(r, parts, context)
    assert straggler(trace, merged) + idle_between_steps(trace, merged) == want


def test_a_gap_at_a_windows_end_is_the_union_of_both_windows_calls():
    """Calls of step 1 and of step 2 overlapping in the gap between them, in two windows: the busy
    time is their union (2 ms), not the sum of each window's (3 ms)."""
    ms = 1_000_000
    parts = [
        idle.IdleParts(False, pd.Series(dtype=float), _pieces([(0, 1, 0, 10 * ms, 12 * ms)])),
        idle.IdleParts(False, pd.Series(dtype=float), _pieces([(0, 1, 0, 11 * ms, 12 * ms)])),
    ]
    st = pd.DataFrame({"rank": [0], "step": [1], "lead_hi": [0.0]})
    assert idle.Idle().merged(parts).busy(st).tolist() == [0.002]


def _pieces(rows: list[tuple]) -> pd.DataFrame:
    columns = ["rank", "step", "which", "lo", "hi"]
    return pd.DataFrame(rows, columns=columns).astype({"lo": float, "hi": float})


def _same_calls(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """The same calls (windows concatenate them in step order, the trace by rank then time)."""
    key = ["rank", "step", "ts"]
    pd.testing.assert_frame_equal(
        a.sort_values(key, kind="stable").reset_index(drop=True),
        b.sort_values(key, kind="stable").reset_index(drop=True),
        check_exact=True,
        check_categorical=False,
    )


def _same_idle(steps: pd.DataFrame):
    """The same first forwards, and the same collective seconds in every step's idle windows."""

    def same(a: idle.IdleParts, b: idle.IdleParts) -> None:
        assert a.layers == b.layers
        _series(a.first, b.first)
        st = idle.windows(steps)
        st = idle.with_lead(st, a.first) if a.layers else st.assign(lead_hi=st["start"])
        np.testing.assert_array_equal(a.busy(st), b.busy(st))

    return same
