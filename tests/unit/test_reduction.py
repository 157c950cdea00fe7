"""The reductions `Metrics` gives the rules (`diag.metrics.reduction`) are the same computed a window
of steps at a time and merged as on the whole trace, on every diag sample and fixture folder."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from diag.analyzers.pipeline_bubble import _p2p_union, _sends_at_largest
from diag.analyzers.tiny_collectives import _tiny

from diag.metrics import reduction
from diag.metrics.positions import known_members, place
from diag.metrics.stage import Metrics
from diag.trace.reader import load_trace
from tests.unit.test_selection import _same
from tests.unit.windowing import assert_windowed, diag_folders

# one of each shape (ZeRO-3, TP, PP, tiny calls, a hang of many steps): the 29 folders
# took 2 minutes; tests/unit/test_windowed_analyze.py runs the rules end to end
SHAPES = {"zero3", "megatron_tp2", "repro_tiny_collectives", "hang_killed_early", "pp2_starved"}
FOLDERS = [d for d in diag_folders() if os.path.basename(d) in SHAPES]


@pytest.mark.parametrize("folder", FOLDERS, ids=os.path.basename)
def test_reductions_merge_to_the_whole(folder):
    trace = load_trace(folder)
    assert_windowed(trace, reduction.Select(), _same)
    assert_windowed(trace, reduction.Select(_tiny), _same)
    assert_windowed(trace, reduction.Calls())
    assert_windowed(trace, reduction.Groups())
    assert_windowed(trace, reduction.OfSteps(_p2p_union), _series)
    assert_windowed(trace, reduction.OfSteps(_sends_at_largest), _series)


def _series(a: pd.Series, b: pd.Series) -> None:
    pd.testing.assert_series_equal(a.sort_index(), b.sort_index(), check_exact=True, check_index_type=False)


def test_a_reduction_is_computed_once_and_found_by_value():
    m = Metrics(load_trace(os.path.join(os.path.dirname(FOLDERS[0]), "zero3")))
    assert m.reduce(reduction.Select(_tiny)) is m.select(_tiny)  # equal picks: the one figure
    assert m.calls == m.select().calls > 0


def test_known_members_make_a_short_position_unknown():
    """A group's window in which one member made no call: its positions are full there, short of
    the whole trace's member; with the whole trace's count they are short, as in the whole."""
    c = pd.DataFrame({"group": ["dp", "dp"], "rank": [0, 1], "step": [5, 5], "ts": [10, 11]})
    assert place(c).need.tolist() == [2]
    with known_members({"dp": 3}):
        assert place(c).need.tolist() == [3]
    assert place(c).need.tolist() == [2]  # only within
