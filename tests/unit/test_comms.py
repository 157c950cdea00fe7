"""The comms collector in a real 3-process gloo job: every collective and p2p op torch.distributed
offers is recorded exactly once, with nccl-tests bytes, the right group, completion-based durations,
and the ProcessGroup restored at stop."""

from __future__ import annotations

import ast

import pytest
import torch.multiprocessing as mp

import diag
from diag import schema
from tests.unit import comms_worker as w


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[diag.Trace, dict[int, dict]]:
    root = tmp_path_factory.mktemp("comms")
    trace, results = root / "trace", root / "results"
    results.mkdir()
    init = f"file://{root / 'store'}"
    mp.start_processes(
        w.run, args=(init, str(trace), str(results)), nprocs=w.WORLD, start_method="spawn", join=True
    )
    out = {}
    for r in range(w.WORLD):
        out[r] = ast.literal_eval((results / f"{r}.txt").read_text())
        assert "exception" not in out[r], out[r]["exception"]
    return diag.load(str(trace)), out


def _rows(trace: diag.Trace, rank: int) -> list[tuple]:
    c = trace.comms[trace.comms["rank"] == rank]
    return [
        (
            str(op),
            int(b),
            None if dt is None or dt != dt else str(dt),
            tuple(gr),
            aop if aop is None or aop != aop else bool(aop),
        )
        for op, b, dt, gr, aop in zip(c["op"], c["bytes"], c["dtype"], c["group_ranks"], c["async_op"])
    ]


def test_every_op_recorded_once_with_bytes_dtype_group(job) -> None:
    trace, _ = job
    for r in range(w.WORLD):
        assert _rows(trace, r) == w.EXPECTED[r]


def test_group_size_and_name(job) -> None:
    trace, _ = job
    c = trace.comms
    assert (c["group_size"] == c["group_ranks"].map(len)).all()
    names = c.groupby(c["group_ranks"].map(tuple))["group"].agg(lambda s: set(s.astype(str)))
    assert len(names[w.W]) == 1 and len(names[w.S]) == 1 and names[w.W] != names[w.S]


def test_busbw_uses_group_size_factor(job) -> None:
    trace, _ = job
    c = trace.comms[trace.comms["dur"] > 0]
    for op, ranks, factor in [
        ("all_reduce", w.W, 4 / 3),
        ("all_reduce", w.S, 1.0),
        ("all_gather", w.W, 2 / 3),
        ("reduce_scatter", w.W, 2 / 3),
        ("broadcast", w.W, 1.0),
    ]:
        sel = c[(c["op"] == op) & (c["group_ranks"].map(tuple) == ranks)]
        assert len(sel) > 0
        assert (sel["busbw"] / sel["algbw"]).round(9).eq(round(factor, 9)).all()
        assert sel["algbw"].mul(sel["dur"]).round().eq(sel["bytes"]).all()  # GB/s * ns = bytes


def test_durations_run_to_completion(job) -> None:
    """Rank 1 joins the first two all_reduces (blocking, async) late: the others' records span the
    wait although the calls return at once; rank 1's async one ends at completion, not at its
    wait() SLOW_S later (the future's callback, not the wait, ends it)."""
    trace, _ = job
    c = trace.comms
    assert c["dur"].notna().all() and (c["dur"] >= 0).all()
    for r in range(w.WORLD):
        first_two = c[(c["rank"] == r) & (c["op"] == "all_reduce")]["dur"].iloc[:2].tolist()
        if r == w.SLOW_RANK:
            assert first_two[1] < w.SLOW_S * 1e9
        else:
            assert min(first_two) >= 0.8 * w.SLOW_S * 1e9
    assert trace.errors.empty, trace.errors.to_dict("records")


def test_exceptions_propagate_and_process_group_restored(job) -> None:
    _, results = job
    for r in range(w.WORLD):
        assert results[r]["wrapped"] and results[r]["error_same"]
        assert results[r]["restored"] == []


def test_records_are_in_the_schema_order(job) -> None:
    trace, _ = job
    assert set(schema.FIELDS[schema.COMM]) <= set(trace.comms.columns)
    assert (trace.comms["step"] == 0).all()
