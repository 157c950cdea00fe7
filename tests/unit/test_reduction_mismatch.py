"""collective_mismatch's and embedding_comm's reductions (`diag.metrics.reduction`) are the same
computed a window of steps at a time and merged as on the whole trace: on diag folders of different
shapes, and on synthetic traces where the mismatch lies in a later window than the first, or its
culprit is told by an earlier window's calls."""

from __future__ import annotations

import math
import os

import pandas as pd
import pytest
from diag.analyzers import collective_mismatch as cm
from diag.analyzers import embedding_comm as ec

from diag.metrics.stage import Metrics
from diag.trace.reader import load_trace
from tests.unit.synth_trace import Job, fired
from tests.unit.test_rules_comm import attributing_every_4th
from tests.unit.windowing import assert_windowed, diag_folders

SHAPES = {"zero3", "megatron_tp2", "embedding_heavy", "embedding_moved", "straggler", "hang_killed_early"}
SHAPES |= {"pp2_starved", "join"}
FOLDERS = [d for d in diag_folders() if os.path.basename(d) in SHAPES]


def _series(a: pd.Series, b: pd.Series) -> None:
    pd.testing.assert_series_equal(a.sort_index(), b.sort_index(), check_exact=True, check_index_type=False)


def _details(a: ec.Detail, b: ec.Detail) -> None:
    """Equal, the modules' seconds to 1e-12 (sums of floats added in another order)."""
    _series(a.union, b.union)
    assert a.ops == b.ops and a.ranks == b.ranks and a.modules.keys() == b.modules.keys()
    assert all(math.isclose(a.modules[m], b.modules[m], rel_tol=1e-12) for m in a.modules)


@pytest.mark.parametrize("folder", FOLDERS, ids=os.path.basename)
def test_the_reductions_merge_to_the_whole(folder):
    trace = load_trace(folder)
    assert _mismatches(trace) == []  # (no folder holds a desync: a healthy or otherwise faulty run)
    tracked = ec._tracked(trace)
    moved = assert_windowed(trace, ec.MovedBytes(tracked))
    pick = ec.Embedding(tracked, moved.gathers)
    sized = assert_windowed(trace, ec.SizedBytes(pick))
    detail = assert_windowed(trace, ec.Details(pick), _details)
    if os.path.basename(folder).startswith("embedding_"):  # (the folders it fires on: not all zero)
        assert moved.named + sized > 0 and detail.modules and detail.ranks


def test_a_gradient_sized_as_a_later_windows_gather_counts_in_the_first(tmp_path):
    """Each step's gradient reduce-scatter, issued under the next module, has the size of wte's
    all-gather, which only the last step made: a window of the first steps alone cannot tell the
    reductions carry embedding data; merged, every one counts and the rule fires."""
    job = Job(steps=8)

    def step(r: int, s: int) -> None:
        job.comm(r, s, op="all_reduce", at_ms=10, dur_ms=5, nbytes=1 << 20)
        job.comm(r, s, op="reduce_scatter_tensor", module="blocks.0", at_ms=60, dur_ms=30, nbytes=3 << 22)
        if s == 7:
            job.comm(r, s, op="all_gather_into_tensor", module="wte", at_ms=20, dur_ms=10, nbytes=3 << 22)

    job.each_step(step)
    trace = job.write(str(tmp_path))
    tracked = ec._tracked(trace)
    moved = assert_windowed(trace, ec.MovedBytes(tracked))
    assert moved.gathers == {(0, float(3 << 22)), (1, float(3 << 22))}
    assert moved.named == 2 * (3 << 22) and moved.total == moved.named + moved.grads  # (all-reduces: grads)
    pick = ec.Embedding(tracked, moved.gathers)
    assert assert_windowed(trace, ec.SizedBytes(pick)) == 16 * (3 << 22) == moved.grads - 16 * (1 << 20)
    detail = assert_windowed(trace, ec.Details(pick), _details)
    assert detail.union.loc[(0, slice(1, 6))].tolist() == pytest.approx([0.030] * 6)  # the reduce-scatters
    assert detail.ops["reduce_scatter"] == (16, 16 * (3 << 22))
    (f,) = fired(trace, "embedding_comm")
    assert f.layers == ["wte"]


def _found(a: cm._Part, b: cm._Part) -> None:
    a, b = a.mismatches(), b.mismatches()
    assert [(f.group, f.step, f.k) for f in a] == [(f.group, f.step, f.k) for f in b]
    for x, y in zip(a, b, strict=True):
        pd.testing.assert_frame_equal(
            x.at.reset_index(drop=True), y.at.reset_index(drop=True), check_exact=True
        )


def _mismatches(trace) -> list[cm.Mismatch]:
    """The rule's two reductions, each windowed against the whole."""
    firsts = assert_windowed(trace, cm.FirstSteps())
    return assert_windowed(trace, cm.Mismatches(firsts, cm._session_starts(trace)), _found).mismatches()


def _steps(per_rank: dict[int, list[tuple[int, str, int]]], steps: int = 6, ranks: int = 2) -> Job:
    """Each rank's calls in group world:0 at each step (op, bytes) after `per_rank`'s own: rank ->
    [(step, op, bytes)] replacing that step's second call; a rank's steps past `last` none."""
    job = Job(ranks=ranks, steps=steps, step_ms=100)
    for r in range(ranks):
        odd = {s: (op, n) for s, op, n in per_rank.get(r, [])}
        for s in range(steps):
            if odd.get(s) == ("none", 0):
                continue
            job.comm(r, s, nbytes=33280, at_ms=20, group="world:0")
            op, n = odd.get(s, ("all_reduce", 4))
            job.comm(r, s, op=op, nbytes=n, at_ms=60, group="world:0")
    return job


def test_a_mismatch_past_the_first_window_and_its_culprit_from_earlier_windows(tmp_path):
    """Rank 1 broadcasts at step 5 where rank 0 all-reduces: equal camps, told apart by the call the
    group made at that index in steps 1-4 (earlier windows when a window holds fewer steps)."""
    trace = _steps({1: [(5, "broadcast", 4)]}).write(str(tmp_path / "a"))
    (m,) = _mismatches(trace)
    assert (m.group, m.step, m.k) == ("world:0", 5, 1) and cm._majority(m.at) is None
    firsts, cut = Metrics(trace).reduce(cm.FirstSteps()), cm._session_starts(trace)
    seen = assert_windowed(trace, cm.Earlier(firsts, cut, frozenset({("world:0", 5, 1)})))
    assert seen == {"world:0": {("all_reduce", 4)}}  # (steps 1-4; step 0, each rank's first, left out)
    (f,) = fired(trace, "collective_mismatch")
    assert f.ranks == [1] and f.evidence["expected"] == {"op": "all_reduce", "bytes": 4}


def test_a_member_absent_from_the_mismatch_window_leaves_it_unmatched(tmp_path):
    """Rank 2 stops calling after step 2: a window of steps 3-5 holds only ranks 0 and 1, whose
    calls at step 5 differ; the whole trace's group has 3 members, so no position there is full."""
    gone = [(s, "none", 0) for s in range(3, 6)]
    trace = _steps({1: [(5, "broadcast", 4)], 2: gone}, ranks=3).write(str(tmp_path / "a"))
    assert _mismatches(trace) == [] and fired(trace, "collective_mismatch") == []
    # the same with rank 2 present at step 5: found, in the window of step 5 alone too
    trace = _steps({1: [(5, "broadcast", 4)], 2: gone[:2]}, ranks=3).write(str(tmp_path / "b"))
    (m,) = _mismatches(trace)
    assert m.step == 5 and [int(r) for r in m.at["rank"]] == [0, 1, 2]


def test_a_late_first_step_and_a_reattach_cut_are_left_out_in_every_window(tmp_path):
    """Rank 1 attached at step 3 inside its step (first call missing): its step 3 is left out in
    the window that holds it, known from the whole trace's first steps; and a session begun inside
    step 4 (a boundary record of no duration) cuts that step's calls, whatever window holds them."""
    job = _steps({1: [(s, "none", 0) for s in range(3)]})
    job.events[1] = [e for e in job.events[1] if not (e["step"] == 3 and e["bytes"] == 33280)]
    trace = job.write(str(tmp_path / "late"))
    assert cm.FirstSteps().merged([cm.FirstSteps().of(Metrics(trace))]) == {(0, 0), (1, 3)}
    assert _mismatches(trace) == [] and fired(trace, "collective_mismatch") == []
    job = _steps({})
    job.events[0] = [e for e in job.events[0] if not (e["step"] == 4 and e["bytes"] == 33280)]
    trace = job.write(str(tmp_path / "cut"))
    steps = trace.frames["step"]
    steps.loc[(steps["step"] == 4) & (steps["rank"] == 0), "dur"] = None
    steps.loc[(steps["step"] == 4) & (steps["rank"] == 1), "dur"] = None
    assert cm._session_starts(trace) and _mismatches(trace) == []
    assert fired(trace, "collective_mismatch") == []


def test_the_attributed_steps_are_the_whole_traces_in_every_window(tmp_path):
    """An agent attributing every 4th step (`attributed_steps`, from the whole trace's meta
    records): each window's calls are counted on those steps only, as the whole trace's."""
    job = attributing_every_4th()
    trace = job.write(str(tmp_path))
    tracked = ec._tracked(trace)
    assert tracked == ((0, frozenset({0, 4})), (1, frozenset({0, 4})))
    moved = assert_windowed(trace, ec.MovedBytes(tracked))
    assert moved.total == 2 * 2 * (64 + 3 * 4) * (1 << 20)  # steps 0 and 4 of 2 ranks
    pick = ec.Embedding(tracked, moved.gathers)
    assert assert_windowed(trace, ec.SizedBytes(pick)) == 0
    detail = assert_windowed(trace, ec.Details(pick), _details)
    assert sorted(detail.union.index.get_level_values("step").unique()) == [0, 4]
    assert detail.ops == {"all_gather": (4, 4 * (64 << 20))}
