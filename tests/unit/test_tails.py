"""Each rank's last records from its own rows (`diag.metrics.tails`) against the groupbys of every
call they replace (docs/scale.md), on every diag trace among the samples and fixtures and on calls
in no rank order, with ties in time and calls of no group."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
import pytest
from diag.analyzers import hang_desync

from diag import schema
from diag.importers import load_inputs
from diag.metrics import positions, tails
from diag.metrics.lasts import Tails
from diag.metrics.stage import Metrics
from diag.metrics.text import as_text
from tests.conftest import sample_folders

DIAG_DIRS = [d for d in sample_folders() if any(f.endswith(".jsonl") for f in os.listdir(d))]


def _grouped(c: pd.DataFrame) -> dict[str, dict[int, dict[str, Any]]]:
    """`last_collectives` as a groupby of every call by (group, rank) gave it."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    by = c.groupby([as_text(c["group"]), "rank"], observed=True)
    counts, last = by.size(), c.loc[by["ts"].idxmax()]
    for (group, rank), n, op, nbytes, step in zip(
        counts.index, counts, last["kind"], last["bytes"], last["step"]
    ):
        out.setdefault(group, {})[int(rank)] = {
            "count": int(n),
            "op": op,
            "bytes": hang_desync._size(nbytes),
            "step": int(step),
        }
    return out


def _same(got: dict[str, dict[int, dict[str, Any]]], want: dict[str, dict[int, dict[str, Any]]]) -> None:
    assert list(got) == list(want)  # the order too: the evidence lists groups and ranks in it
    for group, ranks in want.items():
        assert list(got[group].items()) == list(ranks.items()), group


@pytest.mark.parametrize("path", DIAG_DIRS, ids=os.path.basename)
def test_each_ranks_last_records_are_the_groupbys(path):
    trace = load_inputs([path], slim=True)
    c = Metrics(trace).comms
    if not c.empty:
        _same(hang_desync.last_collectives(Tails.of(c)), _grouped(c))
    for kind in (schema.STEP, schema.COMM, schema.STATS, schema.MEMORY, schema.LAYER):
        df = trace.frame(kind)
        if df.empty or "ts" not in df:
            continue
        ts = pd.to_numeric(df["ts"], errors="coerce")
        pd.testing.assert_series_equal(tails.max_by_rank(ts, df["rank"]), ts.groupby(df["rank"]).max())


def _calls(seed: int, n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    groups = np.array(["dp:0", "tp:1", "world:2", None], dtype=object)
    return pd.DataFrame(
        {
            "rank": rng.integers(0, 5, n),  # in no order: the groupby's fallback and the index arrays
            "group": pd.Categorical(groups[rng.integers(0, 4, n)], categories=["dp:0", "tp:1", "world:2"]),
            "ts": rng.integers(0, 40, n),  # ties in time: the first row of the latest start is the last
            "kind": pd.Categorical(np.array(["all_reduce", "broadcast"])[rng.integers(0, 2, n)]),
            "bytes": rng.choice([np.nan, 4.0, 1024.0], n),
            "step": rng.integers(0, 9, n),
            "dur": rng.choice([np.nan, 5.0], n),
        },
        index=rng.permutation(n) + 100,
    )


@pytest.mark.parametrize("seed", range(6))
def test_calls_in_no_rank_order_give_the_groupbys(seed, monkeypatch):
    monkeypatch.setattr(positions, "CHUNK_ROWS", 50 * (seed + 1))  # chunks of 1 to 4 ranks' rows
    c = _calls(seed)
    _same(hang_desync.last_collectives(Tails.of(c)), _grouped(c))
    ordered = c.sort_values("rank", kind="stable")  # sorted ranks: slices
    _same(hang_desync.last_collectives(Tails.of(ordered)), _grouped(ordered))
    text = c.assign(group=c["group"].astype(object).where(c["group"].notna(), None))  # text, not categories
    _same(hang_desync.last_collectives(Tails.of(text)), _grouped(text))
    ts = c["ts"].astype(float).mask(c["step"] == 3)  # missing values skipped, a rank of none NaN
    for frame, values in ((c, ts), (ordered, ts.reindex(ordered.index))):
        want = values.groupby(frame["rank"]).max()
        pd.testing.assert_series_equal(tails.max_by_rank(values, frame["rank"]), want)
        got = tails.max_by_rank(frame["ts"], frame["rank"])
        pd.testing.assert_series_equal(got, frame["ts"].groupby(frame["rank"]).max())
        rows = pd.DataFrame({"rank": frame["rank"].to_numpy(), "ts": frame["ts"].to_numpy()})
        last = rows.rename_axis("at").sort_values(["rank", "ts", "at"]).groupby("rank").tail(1)
        np.testing.assert_array_equal(tails.last_rows(frame["rank"], frame["ts"]), last.index)
