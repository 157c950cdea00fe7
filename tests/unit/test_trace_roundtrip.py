"""The trace format: agent writes, reader loads; tolerant of truncation and unknown fields."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

import diag
from diag import agent, schema
from diag.errors import DiagError
from tests.workloads.launch import diag_cli as launch_cli


def _start(tmp_path, **kw):
    return agent.start(str(tmp_path), what=("steps",), **kw)


def test_roundtrip_and_bandwidth(tmp_path):
    ag = _start(tmp_path)
    t0 = ag.now()
    ag.emit(
        (
            schema.COMM,
            3,
            "all_reduce",
            4_000_000,
            "float32",
            "pg0",
            4,
            [0, 1, 2, 3],
            t0,
            2_000_000,
            "embedding",
            False,
        )
    )
    agent.stop()
    tr = diag.load(str(tmp_path))
    row = tr.comms.iloc[0]
    assert row["op"] == "all_reduce" and row["bytes"] == 4_000_000
    assert row["algbw"] == pytest.approx(2.0)  # 4 MB in 2 ms = 2 GB/s
    assert row["busbw"] == pytest.approx(2.0 * 2 * 3 / 4)
    assert abs(row["ts"] - time.time_ns()) < 60e9  # converted to the wall clock


def test_comm_records_without_bandwidths_are_analyzed(tmp_path):
    """A trace whose comm records lack the writer's derived algbw / busbw (another tool's, or
    trimmed by hand) gets them as the agent derives them: the bandwidth table raised a KeyError."""
    from tests.workloads.launch import ROOT

    src = os.path.join(ROOT, "sample_traces", "zero3")
    for name in sorted(os.listdir(src)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(src, name)) as f, open(tmp_path / name, "w") as out:
            for line in f:
                rec = json.loads(line)
                if rec.get("k") == schema.COMM:
                    del rec["algbw"], rec["busbw"]
                out.write(json.dumps(rec) + "\n")
    whole, trimmed = diag.load(src), diag.load(str(tmp_path))
    for col in ("algbw", "busbw"):
        assert trimmed.comms[col].tolist() == pytest.approx(whole.comms[col].tolist())
    out = launch_cli("analyze", str(tmp_path), "--json")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert json.loads(out.stdout)["metrics"]["bandwidth_by_size"]


def test_trace_file_private_and_header(tmp_path):
    ag = _start(tmp_path)
    path = ag.status()["trace_file"]
    agent.stop()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        header = json.loads(f.readline())
    assert header["k"] == "header" and header["schema"] == schema.SCHEMA_VERSION
    assert header["pid"] == os.getpid()


def test_truncated_last_line_and_unknown_fields(tmp_path):
    ag = _start(tmp_path)
    path = ag.status()["trace_file"]
    ag.emit((schema.STEP, 0, ag.now(), 1000, 8, None, True))
    agent.stop()
    with open(path, "a") as f:
        f.write(json.dumps({"k": "step", "step": 1, "ts": 1, "dur": 5, "future_field": 7}) + "\n")
        f.write('{"k": "step", "step": 2, "ts"')  # killed mid-write
    tr = diag.load(str(tmp_path))
    assert list(tr.steps["step"]) == [1, 0] or sorted(tr.steps["step"]) == [0, 1]
    assert "future_field" in tr.steps.columns
    assert len(tr.truncated) == 1 and "truncated" in str(tr.truncated[0])


def test_second_start_reuses_agent_and_new_file_per_session(tmp_path):
    a1 = _start(tmp_path)
    assert _start(tmp_path) is a1
    agent.stop()
    a2 = _start(tmp_path)
    assert a2 is not a1 and a2.status()["trace_file"] != a1.status()["trace_file"]
    agent.stop()


def test_ring_drops_are_counted(tmp_path):
    ag = _start(tmp_path, ring_capacity=10)
    ag._stop.set()  # stall the writer thread
    ag._thread.join()
    for i in range(50):
        ag.emit((schema.STEP, i, ag.now(), 1, None, None, True))
    assert ag.ring.dropped == {"step": 40}
    agent.stop()
    stats = diag.load(str(tmp_path)).stats
    assert stats.iloc[-1]["dropped"] == {"step": 40}


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(DiagError, match="no such file"):
        diag.load(str(tmp_path / "missing"))
    with pytest.raises(DiagError, match="no diag trace files"):
        diag.load(str(tmp_path))
    (tmp_path / "rank-00000.jsonl").write_bytes(b"\x00\x01binary")
    with pytest.raises(DiagError, match=r"rank-00000\.jsonl"):
        diag.load(str(tmp_path))


def test_load_api_repr_units_and_layer_tree():
    """The public `diag.load`: a one-line repr (not the frames), integer nanosecond times, and the
    layer tree's depth / leaf columns (the root is named by its class, its children unprefixed)."""
    from tests.conftest import ROOT

    tr = diag.load(os.path.join(ROOT, "sample_traces", "megatron_tp2"))
    text = repr(tr)
    assert "\n" not in text and len(text) < 200 and "2 rank(s)" in text and f"step {len(tr.steps)}" in text
    for df in (tr.steps, tr.layers, tr.comms):  # whole nanoseconds (float64 only where one is missing)
        assert str(df["ts"].dtype) == "int64" and (df["dur"].dropna() % 1 == 0).all()
    assert str(tr.layers["dur"].dtype) == "int64" and tr.steps["dur"].max() > 1e6  # ns, not ms
    lay = tr.layers.drop_duplicates("module").set_index("module")
    assert lay.loc["GPTModel", "depth"] == 0 and not lay.loc["GPTModel", "leaf"]
    assert lay.loc["decoder", "depth"] == 1 and not lay.loc["decoder", "leaf"]
    assert lay.loc["decoder.layers.0.mlp.linear_fc1", "leaf"] and lay.loc["output_layer", "leaf"]
    names = set(lay.index)
    assert {n for n in names if lay.loc[n, "leaf"]} == {
        n for n in names if n != "GPTModel" and not any(o.startswith(n + ".") for o in names)
    }
    for prop in ("steps", "layers", "comms", "memory", "overflow", "errors", "stats", "gpu", "ranks"):
        assert getattr(type(tr), prop).__doc__, prop
