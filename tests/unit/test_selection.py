"""`Selected`: a rule's selected calls reduced, the same whether reduced whole or a window of steps
at a time and merged (the windowed pass), and its median and orders as the rules printed them."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.metrics import positions
from diag.metrics.selection import Selected
from diag.metrics.stage import Metrics
from diag.trace.reader import load_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDERS = ["zero3", "repro_tiny_collectives", "megatron_tp2", "embedding_heavy", "straggler"]


def _windows(c: pd.DataFrame, size: int) -> list[pd.DataFrame]:
    """`c`'s calls a window of `size` steps at a time, in step order (step -1 first)."""
    steps = np.sort(c["step"].unique())
    return [c[c["step"].isin(steps[i : i + size])] for i in range(0, len(steps), size)]


def _same(a: Selected, b: Selected) -> None:
    assert (a.calls, a.ranks, a.max_dur_s) == (b.calls, b.ranks, b.max_dur_s)
    pd.testing.assert_series_equal(a.counts.sort_index(), b.counts.sort_index())
    pd.testing.assert_series_equal(a.sums.sort_index(), b.sums.sort_index(), check_exact=True)
    pd.testing.assert_series_equal(a.sizes.sort_index(), b.sizes.sort_index(), check_names=False)
    pd.testing.assert_frame_equal(a.kinds.sort_index(), b.kinds.sort_index(), check_exact=True)
    pd.testing.assert_series_equal(a.modules.sort_index(), b.modules.sort_index(), check_names=False)
    np.testing.assert_equal(a.median_bytes(), b.median_bytes())  # (NaN where no size is known)
    assert (a.ops(), a.top_modules(5)) == (b.ops(), b.top_modules(5))


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_windows_merged_equal_the_whole(folder, size):
    m = Metrics(load_trace(os.path.join(ROOT, "sample_traces", folder)))
    c = m.comms
    assert len(c), "a sample with collectives"

    def small(c: pd.DataFrame) -> pd.Series:
        return pd.to_numeric(c["bytes"], errors="coerce") < 64 << 10

    for pick in (None, small):
        whole = m.select(pick)
        picked = c if pick is None else c[pick(c)]
        parts = [Selected.of(w) for w in _windows(picked, size)]
        merged = parts[0]
        for p in parts[1:]:
            merged = merged.merge(p)
        _same(whole, merged)
        if size == 1 and len(parts) > 2:  # the merge is what makes them equal: one window is not
            assert parts[0].calls < whole.calls


def test_comm_per_step_is_the_selection_joined_to_steady_steps():
    m = Metrics(load_trace(os.path.join(ROOT, "sample_traces", "zero3")))
    per = m.comm_per_step()
    want = m.comms.groupby(["rank", "step"], observed=True)["dur_s"].sum()
    got = per.set_index(["rank", "step"])["comm_s"]
    steady = got.index.intersection(want.index)
    assert len(steady) == len(got) > 0
    pd.testing.assert_series_equal(got.loc[steady], want.loc[steady], check_names=False)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from([4, 8, 1024, 65536, 3.5])), min_size=0, max_size=30))
def test_median_bytes_is_series_median(sizes):
    c = pd.DataFrame(
        {
            "rank": 0,
            "step": range(len(sizes)),
            "dur_s": 0.001,
            "bytes": pd.Series(sizes, dtype=float),
            "kind": "all_reduce",
        }
    )
    got, want = Selected.of(c).median_bytes(), c["bytes"].median()
    assert (np.isnan(got) and np.isnan(want)) or got == want


def test_orders_are_counts_then_names(monkeypatch):
    c = pd.DataFrame(
        {
            "rank": [1, 0, 0, 1, 0],
            "step": [0, 0, 1, 1, 2],
            "dur_s": [0.1, 0.2, 0.3, 0.4, 0.5],
            "bytes": [8.0, 8.0, 16.0, None, 8.0],
            "kind": ["broadcast", "all_reduce", "all_gather", "all_reduce", "broadcast"],
            "module": ["b", "a", None, "a", "b"],
        }
    )
    sel = Selected.of(c)
    assert sel.ops() == {"all_reduce": 2, "broadcast": 2, "all_gather": 1}
    assert sel.top_modules(5) == ["a", "b"]
    assert sel.median_bytes() == 8.0 and sel.max_dur_s == 0.5 and sel.ranks == {0, 1}
    assert sel.counts.to_dict() == {(0, 0): 1, (0, 1): 1, (0, 2): 1, (1, 0): 1, (1, 1): 1}
    monkeypatch.setattr(positions, "CHUNK_ROWS", 1)  # a chunk a rank: the same as both at once
    _same(Selected.of(c), sel)
    empty = Selected.of(c.iloc[:0])
    assert empty.calls == 0 and np.isnan(empty.median_bytes()) and empty.ops() == {}
    assert sel.merge(empty).ops() == sel.ops()
