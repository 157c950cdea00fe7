"""The report document's per-(rank, step) tables above `kept_ranks.ROWS` rank-steps: the rows of the
ranks worth a look, every step of each; what is across every rank a step at a time (`steps`,
`memory.by_step`) still read from every rank."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diag import schema
from diag.findings import Finding
from diag.report import json_report, kept_ranks, model
from tests.unit.synth_trace import Job

RANKS, STEPS = 7, 12
SLOW, FAST, BIG, SMALL, NAMED = 3, 6, 4, 2, 5  # rank 6 is the last too


def _job(tmp_path):
    job = Job(ranks=RANKS, steps=STEPS)

    def memory(rank: int, step: int) -> None:
        rss = (2 << 30) + rank * (1 << 20) + step * 4096
        rss = {BIG: 8 << 30, SMALL: 1 << 30}.get(rank, rss)
        job.add(rank, schema.MEMORY, step=step, ts=job.start(rank, step) + 1, device="cpu", rss=rss)

    job.each_step(memory)
    ms = {SLOW: 140.0, FAST: 60.0, **{r: 100.0 + r for r in (0, 1, 2, 4, 5)}}
    return job.write(str(tmp_path / "t"), step_ms=ms)


FINDING = Finding(rule="straggler", severity="warning", title="t", detail="d", ranks=[NAMED])


def _doc(trace, monkeypatch, limit):
    monkeypatch.setattr(kept_ranks, "ROWS", limit)
    return json.loads(json_report.render(model.build(trace, [FINDING], {})))


def test_a_document_above_the_limit_keeps_the_ranks_that_stand_out(tmp_path, monkeypatch):
    trace = _job(tmp_path)
    doc = _doc(trace, monkeypatch, RANKS * STEPS - 1)
    kept = [0, SMALL, SLOW, BIG, NAMED, FAST]  # first, memory's ends, step time's ends, the finding's
    assert doc["version"] == 2
    assert doc["rank_steps"] == {"rows": RANKS * STEPS, "limit": RANKS * STEPS - 1, "ranks": sorted(kept)}
    for rows in (doc["metrics"]["step_times"], doc["throughput"]["per_step"], doc["memory"]["timeline"]):
        got = pd.DataFrame(rows).groupby("rank")["step"].nunique()
        assert sorted(got.index) == sorted(kept) and set(got) == {STEPS}
    # every rank's steps and memory still make the per-step figures across ranks
    assert {s["ranks"] for s in doc["steps"]} == {RANKS} and {s["slowest_rank"] for s in doc["steps"]} == {
        SLOW
    }
    by = doc["memory"]["by_step"]
    assert [r["step"] for r in by] == list(range(STEPS)) and {r["ranks"] for r in by} == {RANKS}
    assert {r["rss_max"] for r in by} == {8 << 30} and {r["rss_rank"] for r in by} == {BIG}
    assert all(r["allocated_max"] is None and r["allocated_rank"] is None for r in by)
    assert len(doc["memory"]["peaks"]) == RANKS and len(doc["throughput"]["per_rank"]) == RANKS


def test_a_document_within_the_limit_keeps_every_row(tmp_path, monkeypatch):
    trace = _job(tmp_path)
    doc = _doc(trace, monkeypatch, RANKS * STEPS)
    assert doc["rank_steps"]["ranks"] is None
    for rows in (doc["metrics"]["step_times"], doc["throughput"]["per_step"], doc["memory"]["timeline"]):
        assert len(rows) == RANKS * STEPS


def test_by_step_takes_the_highest_and_its_lowest_rank():
    memory = pd.DataFrame(
        {
            "rank": [2, 1, 0, 0, 1, 1],  # ranks 1 and 0 equal at step 1: rank 0 is named
            "step": [1, 1, 1, 2, 2, None],
            "allocated": [5.0, 9.0, 9.0, None, None, 99.0],
            "reserved": [6.0, 10.0, 9.0, 1.0, 2.0, 99.0],
            "rss": [None] * 6,
        }
    )
    by = kept_ranks.by_step(memory)
    assert by["step"].tolist() == [1, 2] and by["ranks"].tolist() == [3, 2]
    assert by["allocated_max"].tolist()[0] == 9.0 and np.isnan(by["allocated_max"].tolist()[1])
    assert by["allocated_rank"].tolist()[0] == 0 and by["allocated_rank"].isna().tolist() == [False, True]
    assert by["reserved_max"].tolist() == [10.0, 2.0] and "reserved_rank" not in by
    assert by["rss_max"].isna().all()


@pytest.mark.parametrize("rows", [0, 5])
def test_shown_is_every_rank_within_the_limit(rows):
    st = pd.DataFrame({"rank": [0] * rows, "step": range(rows), "dur_ns": [1.0] * rows})
    assert kept_ranks.shown(st, pd.DataFrame(), [], limit=5) is None


def _by_step_sorted(memory: pd.DataFrame) -> pd.DataFrame:
    """The same figures by a sort of the records (the first version's way, a frame of them)."""
    df = memory[pd.to_numeric(memory["step"], errors="coerce").notna()].astype({"step": np.int64})
    counts = df.groupby("step").size()
    out = pd.DataFrame({"step": counts.index.to_numpy(), "ranks": counts.to_numpy()})
    for col in ("allocated", "reserved", "rss"):
        top = (
            df[df[col].notna()]
            .sort_values(["step", col, "rank"], ascending=[True, False, True])
            .drop_duplicates("step")
            .set_index("step")
            .reindex(counts.index)
        )
        out[f"{col}_max"] = top[col].to_numpy(dtype=float)
        if col != "reserved":
            out[f"{col}_rank"] = top["rank"].astype("Int64").to_numpy()
    return out


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 5),  # rank
            st.one_of(st.none(), st.integers(0, 6), st.integers(10**6, 10**6 + 3)),  # step: sparse too
            *[st.one_of(st.none(), st.sampled_from([0.0, 1.0, 2.0, 2.0, 7.5]))] * 3,
        ),
        min_size=1,
        max_size=40,
    )
)
def test_by_step_is_the_sorts(rows):
    memory = pd.DataFrame(rows, columns=["rank", "step", "allocated", "reserved", "rss"])
    memory = memory.astype({"allocated": float, "reserved": float, "rss": float})
    if memory["step"].isna().all():
        assert kept_ranks.by_step(memory).empty
        return
    pd.testing.assert_frame_equal(
        kept_ranks.by_step(memory), _by_step_sorted(memory), check_dtype=False, check_index_type=False
    )
