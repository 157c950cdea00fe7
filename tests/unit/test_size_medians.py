"""`bandwidth_by_size` from two reductions (`size_medians`: the values' bins, then the middle bins'
values) equals `breakdown.by_size` on the whole trace, windows of 1, 3 and all steps merged: the
median's order statistics and arithmetic, on values that repeat, lie in one bin or many, are
missing, and on more sizes than the scan takes (pandas' groupby median)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diag.metrics import breakdown, size_medians
from diag.metrics.stage import Metrics
from diag.trace.model import Trace
from tests.unit.windowing import assert_windowed


def _trace(seed: int, sizes: int, steps: int = 12, ranks: int = 4, calls: int = 40) -> Trace:
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        for rank in range(ranks):
            for k in range(calls):
                bw = float(
                    rng.choice([rng.uniform(0.5, 80.0), 12.5, 12.5 + 1e-12, np.nan], p=[0.7, 0.1, 0.1, 0.1])
                )
                rows.append(
                    {
                        "rank": rank,
                        "op": ["all_reduce", "all_gather", "reduce_scatter"][k % 3],
                        "bytes": int(rng.integers(1, sizes + 1)) * 4096,
                        "group": "dp",
                        "group_size": ranks,
                        "group_ranks": list(range(ranks)),
                        "ts": 10**9 * step + 1000 * k + rank,
                        "dur": 500,
                        "step": step,
                        "busbw": bw,
                    }
                )
    st = [
        {"rank": r, "step": s, "ts": 10**9 * s, "dur": 10**9 - 1} for s in range(steps) for r in range(ranks)
    ]
    return Trace(
        {r: {"rank": r} for r in range(ranks)}, {"comm": pd.DataFrame(rows), "step": pd.DataFrame(st)}
    )


@pytest.mark.parametrize(("seed", "sizes"), [(1, 5), (2, 2), (3, 300)])
def test_the_medians_of_the_windows_are_the_whole_traces(seed, sizes):
    trace = _trace(seed, sizes)
    want = breakdown.bandwidth_by_size(trace)
    assert len(want) and want["busbw"].notna().sum() > len(want) / 2
    bins = assert_windowed(trace, size_medians.SizeBins(), _same_frame)
    middle = assert_windowed(trace, size_medians.SizeMiddle(size_medians.wanted(bins)), _same_frame)
    if sizes < 10:  # only the middle bins' values are kept (of many calls a size)
        assert len(middle) < len(trace.comms) / 4
    got = size_medians.frame(bins, middle)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert got.equals(size_medians.of_windows(Metrics(trace)))


def test_a_wrong_rank_within_the_bin_is_caught():
    """The test can fail: one order statistic off gives another median."""
    trace = _trace(4, 3)
    m = Metrics(trace)
    bins = m.reduce(size_medians.SizeBins())
    middle = m.reduce(size_medians.SizeMiddle(size_medians.wanted(bins)))
    shifted = middle[middle.duplicated(["op", "bytes", "bin"])]  # each bin's least value left out
    assert not size_medians.frame(bins, shifted).equals(breakdown.bandwidth_by_size(trace))


def _same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    keys = [c for c in a.columns if c != "n"]
    pd.testing.assert_frame_equal(
        a.sort_values(keys, kind="stable").reset_index(drop=True),
        b.sort_values(keys, kind="stable").reset_index(drop=True),
        check_exact=True,
    )
