"""The straggler rule's and the idle gaps' reductions (`analyzers.straggler`, `diag.metrics.idle`)
are the same computed a window of steps at a time and merged as on the whole trace; and the rules,
reading the merged ones, find what they find on the whole trace."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from diag.analyzers.idle_between_steps import idle_between_steps
from diag.analyzers.straggler import ArrivalCalls, ArrivalWaits, CommRanks, TailWait, straggler

from diag.metrics import idle, positions, window_metrics
from diag.metrics.stage import Metrics
from diag.trace.model import Trace
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
    same = (_series, _series, _equal, _same_calls, _same_idle(Metrics(trace).steps))
    assert_windowed(trace, _Each(REDUCTIONS), lambda a, b: [f(x, y) for f, x, y in zip(same, a, b)])


@dataclass(frozen=True)
class _Each:
    """The reductions `rs` side by side: one split of the trace into windows for all (test time)."""

    rs: tuple

    def of(self, metrics: Metrics) -> tuple:
        return tuple(r.of(metrics) for r in self.rs)

    def merged(self, parts: list[tuple]) -> tuple:
        return tuple(r.merged([p[i] for p in parts]) for i, r in enumerate(self.rs))


def _equal(a, b) -> None:
    assert a == b


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


def test_calls_of_the_next_step_in_a_gap_count_there_in_windows():
    """repro_idle_is_collectives' calls lie in the gaps after their steps; tagged with the next
    step instead, each is in the next window of one step, before its time (a spill): the gaps'
    collective seconds are the same, whole and merged."""
    trace = load_trace(next(d for d in diag_folders() if d.endswith("repro_idle_is_collectives")))
    c = trace.frames["comm"]
    moved = Trace(headers=trace.headers, frames={**trace.frames, "comm": c.assign(step=c["step"] + 1)})
    want = idle.gaps(Metrics(trace))["comm_gap_s"]
    assert want.sum() > 0
    pd.testing.assert_series_equal(idle.gaps(Metrics(moved))["comm_gap_s"], want, check_exact=True)
    assert_windowed(moved, idle.Idle(), _same_idle(Metrics(moved).steps))
    ones = window_metrics.merged(idle.Idle(), windows(moved, 1), window_metrics.Whole.of(Metrics(moved)))
    assert len(ones.spills)  # (the premise: calls read from the window after their gap)
    # each call and its copy tagged with the next step (1 ns later) in every gap: both windows' calls
    # there, united; as well where each window holds every step mark (the pass holds them whole)
    both = Trace(
        headers=trace.headers,
        frames={**trace.frames, "comm": pd.concat([c, c.assign(step=c["step"] + 1, ts=c["ts"] + 1)])},
    )
    context, same = window_metrics.Whole.of(Metrics(both)), _same_idle(Metrics(both).steps)
    assert_windowed(both, idle.Idle(), same)
    marks = [
        Trace(headers=w.headers, frames={**w.frames, "step": both.frames["step"]}) for w in windows(both, 1)
    ]
    same(Metrics(both).reduce(idle.Idle()), window_metrics.merged(idle.Idle(), marks, context))


def test_a_gap_at_a_windows_end_is_the_union_of_both_windows_calls():
    """Step 1's last call and step 2's first overlap in the gap between them, in two windows: the
    busy time is their union (2.5 ms), not the sum of each window's (3.5 ms)."""
    ms = 1_000_000
    none = pd.DataFrame(columns=["rank", "step", "gap", "lead"])
    parts = [
        idle.IdleParts(
            False, pd.Series(dtype=float), none, _pieces([(0, 1, 0, 10 * ms, 12 * ms)]), _spills([])
        ),
        idle.IdleParts(False, pd.Series(dtype=float), none, _pieces([]), _spills([(0, 11 * ms, 13 * ms)])),
    ]
    st = pd.DataFrame(
        {"rank": [0], "step": [1], "start": [0.0], "lead_hi": [0.0], "lo": [9e6], "hi": [12.5e6]}
    )
    assert idle.Idle().merged(parts).busy(st).tolist() == [0.0025]


@pytest.mark.parametrize("pairs", [1, idle.SPILL_PAIRS])
def test_spilled_calls_meet_each_row_of_their_rank(monkeypatch: pytest.MonkeyPatch, pairs: int) -> None:
    """A spill in rank 0's gap after step 1 and the lead-in of step 2, one in rank 1's gap: each
    row gets its own piece, whatever the chunks of (spill, row) pairs (`SPILL_PAIRS`)."""
    monkeypatch.setattr(idle, "SPILL_PAIRS", pairs)
    ms = 1_000_000
    none = pd.DataFrame(columns=["rank", "step", "gap", "lead"])
    spills = _spills([(1, 10.5 * ms, 10.8 * ms), (0, 11 * ms, 12.5 * ms), (2, 0, 99 * ms)])
    parts = idle.IdleParts(True, pd.Series(dtype=float), none, _pieces([]), spills)
    st = pd.DataFrame(
        {
            "rank": [1, 0, 0],
            "step": [1, 1, 2],
            "start": [0.0, 0.0, 12e6],
            "lead_hi": [0.0, 0.0, 13e6],
            "lo": [10e6, 10e6, 20e6],
            "hi": [11e6, 12e6, 20e6],
        }
    )
    assert parts.busy(st).tolist() == [0.0003, 0.001, 0.0005]


def _pieces(rows: list[tuple]) -> pd.DataFrame:
    columns = ["rank", "step", "which", "lo", "hi"]
    return pd.DataFrame(rows, columns=columns).astype({"lo": float, "hi": float})


def _spills(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rank", "lo", "hi"]).astype({"lo": float, "hi": float})


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


@pytest.mark.parametrize("name", ["healthy_blip", "repro_idle_is_collectives"])
def test_ranks_in_chunks_give_what_one_chunk_gives(name, monkeypatch):
    """`positions.rank_chunks`: a rank a chunk (a long trace's calls run in several) gives what
    every rank in one chunk gives (a window's, a short trace's)."""
    trace = load_trace(next(d for d in FOLDERS if d.endswith(name)))
    want = [r.of(Metrics(trace)) for r in (TailWait(), ArrivalWaits(), idle.Idle())]
    monkeypatch.setattr(positions, "rank_chunks", functools.partial(positions.rank_chunks, rows=1))
    got = [r.of(Metrics(trace)) for r in (TailWait(), ArrivalWaits(), idle.Idle())]
    for a, b in zip(want[:2], got[:2]):
        pd.testing.assert_series_equal(a, b, check_exact=True)
    for part in ("seconds", "pieces", "spills"):
        pd.testing.assert_frame_equal(getattr(want[2], part), getattr(got[2], part), check_exact=True)
