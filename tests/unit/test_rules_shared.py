"""What the rules share: the stage's per-step and comm tables (vectorized helpers against their
per-row / per-group definitions), settings, evidence helpers and the op vocabulary."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from diag.analyzers import config, evidence
from diag.collectors.comms.ops import METHODS
from hypothesis import given, settings
from hypothesis import strategies as st

from diag import schema
from diag.metrics import bandwidth, intervals, steps
from diag.metrics.stage import Metrics
from diag.vocab import P2P, canonical_op
from tests.unit.synth_trace import MS, T0, Job

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "barrier"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(OPS),
            st.integers(0, 1 << 30),
            st.integers(-5, 10**9),
            st.one_of(st.none(), st.integers(0, 64)),
        ),
        min_size=1,
        max_size=15,
    )
)
def test_busbw_equals_schema_bandwidths_per_row(rows):
    ops, nbytes, durs, sizes = (pd.Series(col, dtype=object) for col in zip(*rows))
    got = bandwidth.busbw(ops, nbytes, durs, sizes)
    want = [schema.bandwidths(o, b, d, int(n or 0))[1] for o, b, d, n in rows]
    assert got == pytest.approx(want, rel=1e-12)


# (rank, step, offset ns, dur ns): epoch-scale starts, gaps of 1 ns, zero-length and nested ops
spans = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 60), st.integers(0, 15)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=50, deadline=None)
@given(spans)
def test_union_by_step_equals_per_group_merge(rows):
    df = pd.DataFrame(rows, columns=["rank", "step", "ts", "dur"]).assign(ts=lambda d: T0 + d["ts"])
    got = steps.union_by_step(df)
    for (rank, step), part in df.groupby(["rank", "step"]):
        ts = part["ts"].to_numpy(np.int64)
        want = intervals.total(*intervals.merge(ts, ts + part["dur"].to_numpy(np.int64)))
        assert got[(rank, step)] == want / steps.NS


def test_union_by_step_keeps_nanosecond_gaps_at_epoch_scale():
    # two 10 ns ops 1 ns apart, ~1.7e18 ns after the epoch: 20 ns covered, not 21
    df = pd.DataFrame({"rank": [0, 0], "step": [3, 3], "ts": [T0, T0 + 11], "dur": [10, 10]})
    assert steps.union_by_step(df)[(0, 3)] * steps.NS == pytest.approx(20)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9)), min_size=1, max_size=20, unique=True),
    st.integers(0, 2),
)
def test_steady_drops_each_ranks_first_steps(pairs, skip):
    df = pd.DataFrame(pairs, columns=["rank", "step"]).assign(dur_s=1.0)
    got = steps.steady(df, skip)
    sizes = df.groupby("rank").size()
    if sizes.min() <= skip + 1:
        assert got.equals(df)
        return
    want = df[[s >= sorted(df.loc[df["rank"] == r, "step"])[skip] for r, s in zip(df["rank"], df["step"])]]
    assert got.equals(want)


def test_per_step_tables_fill_steps_without_comms(tmp_path):
    job = Job(ranks=2, steps=4)
    job.comm(0, 2, at_ms=10, dur_ms=20)
    job.comm(0, 2, at_ms=15, dur_ms=20, async_op=True)  # overlaps the first: counted once in the union
    trace = job.write(str(tmp_path))
    m = Metrics(trace)
    union = m.union_per_step().set_index(["rank", "step"])["comm_s"]
    total = m.comm_per_step().set_index(["rank", "step"])["comm_s"]
    assert list(union.index) == [(r, s) for r in (0, 1) for s in (1, 2, 3)]  # step 0 is warm-up
    assert union[(0, 2)] == pytest.approx(0.025) and total[(0, 2)] == pytest.approx(0.040)
    assert union.drop((0, 2)).eq(0.0).all() and total.drop((0, 2)).eq(0.0).all()


def test_comms_canonical_kind_busbw_computed_once(tmp_path):
    job = Job(ranks=4, steps=2)
    job.each_step(lambda r, s: job.comm(r, s, op="all_gather_into_tensor", nbytes=8 * MS, dur_ms=8))
    trace = job.write(str(tmp_path))
    m = Metrics(trace)
    c = m.comms
    assert set(c["kind"]) == {"all_gather"}
    busbw = bandwidth.busbw(c["kind"], c["bytes"], pd.to_numeric(c["dur"]), c["group_size"])
    assert busbw == pytest.approx(0.75)  # 1 GB/s algbw x (n-1)/n, from the canonical kind
    assert "busbw" not in c  # the writer's, from its spelling of the op, is not read by mistake
    assert m.comms is c and "kind" not in trace.comms  # one table per trace; the trace's frame as read


def test_by_rank_gives_plain_numbers():
    out = evidence.by_rank(pd.Series([np.float32(0.5), np.int64(2)], index=np.array([3, 1])), float)
    assert out == {3: 0.5, 1: 2.0} and all(type(k) is int and type(v) is float for k, v in out.items())
    assert evidence.by_rank(pd.Series([7.0], index=[0]), int) == {0: 7}
    assert evidence.by_rank(pd.Series(dtype=float)) == {}


SPELLINGS = {
    **{name: spec.op for name, spec in METHODS.items()},
    "isend": "send",
    "irecv": "recv",
    "batch_isend_irecv": "send_recv",
    "recvAnySource": "recv",
    "all_reduce_coalesced": "all_reduce",
    "c10d::allreduce_": "all_reduce",
    "broadcast_object_list": "broadcast",
}


@pytest.mark.parametrize("name,op", sorted(SPELLINGS.items()))
def test_one_op_table_for_collector_importers_and_rules(name, op):
    """The rules name ops with the importers' table: it agrees with the comms collector's own names,
    and every point-to-point spelling lands in `vocab.P2P` (the pipeline-bubble rule's selection)."""
    assert canonical_op(name) == op
    assert (op in P2P) == any(w in name.lower() for w in ("send", "recv"))


def test_setting_fills_code_defaults_for_absent_and_null_keys():
    """Rules read settings without fallbacks of their own: a key the config leaves null is absent."""
    from diag.trace.model import Trace

    tr = Trace(
        headers={
            0: {
                "zero_stage": 2,
                "ds_config": {"fp16": {"initial_scale_power": None, "loss_scale_window": 500}},
                "zero_config": {"reduce_bucket_size": None, "allgather_bucket_size": 2e8},
            }
        }
    )
    assert config.setting(tr, "initial_scale_power") == config.DS_DEFAULTS["initial_scale_power"]
    assert config.setting(tr, "loss_scale_window") == 500
    assert config.setting(tr, "reduce_bucket_size") == config.DS_DEFAULTS["reduce_bucket_size"]
    assert config.setting(tr, "allgather_bucket_size") == 2e8
    assert config.setting(tr, "overlap_comm") is False  # the code default below stage 3


def test_bus_factor_knows_every_spelling_of_an_op():
    """One factor per op whatever the writer called it: spellings map through `vocab.canonical_op`."""
    for name in ("all_gather_into_tensor", "c10d::_allgather_base_", "ncclDevKernel_AllGather_RING_LL"):
        assert schema.bus_factor(name, 4) == schema.bus_factor("all_gather", 4) == 0.75
    assert schema.bus_factor("reduce_scatter_tensor", 2) == 0.5 and schema.bus_factor("allreduce", 2) == 1.0
    assert schema.bus_factor("broadcast", 8) == 1.0 and schema.bus_factor("all_reduce", 0) == 1.0


def test_total_busbw_is_bus_bytes_over_total_time():
    """A set of calls: summed bytes x factor over summed time, not a mean of per-call figures."""
    c = pd.DataFrame(
        {
            "op": ["all_reduce", "all_reduce"],
            "bytes": [4, 1 << 20],
            "dur": [1000, 1 << 20],
            "group_size": [2, 2],
        }
    )
    want = (4 + (1 << 20)) * 1.0 / (1000 + (1 << 20))
    assert bandwidth.total_busbw(c) == pytest.approx(want)
    assert bandwidth.total_busbw(c) != pytest.approx(
        bandwidth.busbw(c["op"], c["bytes"], c["dur"], c["group_size"]).mean()
    )
    assert bandwidth.total_busbw(c.iloc[:0]) == 0.0
