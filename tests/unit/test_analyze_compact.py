"""Bounded-memory analysis of diag's own traces (issue 14): the compact frames `diag analyze` reads
(string columns held as categoricals, their categories united across rank files, docs/scale.md)
give the report the plainest reading gives, on every diag trace among the samples and fixtures and
on a long tiled one. The plainest reading is every record read together, each string column a
column of strings: what the reader gave before (pandas 3 reads text as `str`, which the reader's
`dtype == object` test did not turn into categoricals)."""

from __future__ import annotations

import io
import json
import os

import pandas as pd
import pytest
from diag.analyzers import run_all

from diag.importers import load_inputs
from diag.metrics.stage import Metrics
from diag.report import json_report, model, records
from diag.trace import perfile, reader
from tests.conftest import ROOT, sample_folders

DIAG_DIRS = [d for d in sample_folders() if any(f.endswith(".jsonl") for f in os.listdir(d))]


def _report(path: str) -> str:
    """`diag analyze --json`'s document of `path`."""
    trace = load_inputs([path], slim=True)
    metrics = Metrics(trace)
    findings, failures = run_all(trace, None, metrics)
    assert not failures, failures
    return json_report.render(model.build(trace, findings, failures, metrics))


def _plain_report(path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The report of every record read together with no categorical column (the reference)."""
    with monkeypatch.context() as m:
        m.setattr(reader, "CATEGORICAL", ())
        m.setattr(perfile, "CATEGORICAL", ())
        m.setattr(reader, "load_trace", lambda p, strict=False, window=reader.ALL: _plain(p, window))
        return _report(path)


def _plain(path: str, window: reader.Window) -> reader.Trace:
    trace = reader._load(path, False, window, None)
    for df in trace.frames.values():
        assert not any(isinstance(t, pd.CategoricalDtype) for t in df.dtypes), "not the plain reading"
    return trace


@pytest.mark.parametrize("path", DIAG_DIRS, ids=os.path.basename)
def test_compact_frames_give_the_plain_report(path, monkeypatch):
    assert _report(path) == _plain_report(path, monkeypatch)


def test_a_long_tiled_trace_gives_the_plain_report(tmp_path, monkeypatch):
    """bench.analyze's input (the real ZeRO-3 run tiled, 3 ranks x 30 steps), in chunks of 500
    records: the categories of one file's chunks and of the files are united."""
    from bench.analyze import make_diag_input

    monkeypatch.setattr(reader, "CHUNK", 500)
    make_diag_input(str(tmp_path), 3, 30)
    path = str(tmp_path / "traces")
    assert _report(path) == _plain_report(path, monkeypatch)


def test_the_frames_analysis_reads_are_compact():
    """The string columns of the per-call frames are categoricals, one category per distinct value
    of the whole trace (what makes a 16-rank x 1,000-step comm frame 119 MiB, not 297)."""
    trace = reader.load_trace(os.path.join(ROOT, "sample_traces", "zero3"))
    comms = trace.comms
    for col in ("op", "dtype", "group"):
        assert isinstance(comms[col].dtype, pd.CategoricalDtype), col
        assert list(comms[col].cat.categories) == sorted(comms[col].dropna().unique()), col
    assert isinstance(trace.layers["module"].dtype, pd.CategoricalDtype)


def test_text_columns_stay_categorical_where_that_reads_the_same():
    """`as_text` and `map_categories` give `astype(str)` / `.map` values without a string per row;
    a categorical of anything but sorted strings is turned into strings as before."""
    from diag.metrics.text import as_text, map_categories
    from diag.vocab import canonical_op

    ops = pd.Series(["all_gather_into_tensor", "broadcast", "allreduce", "broadcast"], dtype="category")
    assert as_text(ops) is ops
    kind = map_categories(ops, canonical_op)
    assert isinstance(kind.dtype, pd.CategoricalDtype)
    assert list(kind) == [canonical_op(o) for o in ops.astype(str)]
    assert list(kind.cat.categories) == sorted(set(kind))
    numbered = pd.Series([3, 1], dtype="category")
    assert list(as_text(numbered)) == ["3", "1"]
    assert map_categories(numbered.astype(str), canonical_op) is None  # a string column: mapped as before
    assert map_categories(pd.Series(["x", None], dtype="category"), canonical_op) is None


def test_tiny_collectives_counts_only_the_ops_it_found_tiny(tmp_path):
    """`kind` is a categorical: its `value_counts` on the tiny calls alone would also list the large
    ops, with 0 (the evidence's by_op must name the tiny ones only, as from strings)."""
    from tests.unit.synth_trace import Job, fired

    job = Job(header={"zero_stage": 1, "ds_config": {"zero_optimization": {"stage": 1}}})
    job.each_step(lambda r, s: [job.comm(r, s, nbytes=4096, at_ms=10 + i, dur_ms=0.5) for i in range(40)])
    job.each_step(lambda r, s: job.comm(r, s, op="broadcast", nbytes=8 << 20, at_ms=70, dur_ms=5))
    (f,) = fired(job.write(str(tmp_path)), "tiny_collectives")
    assert f.evidence["by_op"] == {"all_reduce": 80 * job.steps}


def _by_groupby(c: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """transfer_dur and arrival_wait as groupbys define them: the k-th call of a (rank, group,
    step) in time order (ties in row order: the order a rank wrote them); per (group, step, k) the
    least duration where every member has one, and each call's start before the latest; neither
    where the members made different numbers of calls in that group and step (a step an attach cut)."""
    key = c["group"].astype(str)
    step = c["step"] if "step" in c else pd.Series(0, index=c.index)
    by_ts = pd.DataFrame({"ts": c["ts"]}).sort_values("ts", kind="stable")
    k = by_ts.groupby([c["rank"], key, step], observed=True).cumcount()
    frame = pd.DataFrame(
        {
            "g": key,
            "s": step,
            "r": c["rank"],
            "k": k.reindex(c.index),
            "dur": pd.to_numeric(c["dur"]),
            "ts": c["ts"],
        }
    )
    calls = frame.groupby(["g", "s", "r"])["k"].transform("size")
    even = calls.groupby([frame["g"], frame["s"]]).transform(lambda n: n.nunique() == 1).astype(bool)
    by_op = frame.groupby(["g", "s", "k"])
    members = pd.Series(c["rank"].to_numpy(), index=c.index).groupby(key).transform("nunique")
    transfer = by_op["dur"].transform("min").where(by_op["dur"].transform("size") >= members).where(even)
    last = by_op["ts"].transform("max").where(even)
    wait = (last - c["ts"]).clip(lower=0).clip(upper=pd.to_numeric(c["dur"]).fillna(0)).astype(float)
    return transfer, wait


def test_positions_on_integer_arrays_equal_the_groupbys():
    """`comms.transfer_dur` / `arrival_wait` (integer arrays, `diag.metrics.positions`) on random
    calls: ties in time, calls of no group, unknown durations, categorical groups, shuffled rows."""
    import random

    from diag.metrics.comms import arrival_wait, transfer_dur

    rng, partial = random.Random(5), 0
    for _ in range(80):
        rows, ts = [], 1_796_222_274_263_065_762
        for r in rng.sample([0, 1, 2, -77], rng.randint(1, 4)):
            for _ in range(rng.randint(1, 12)):
                ts += rng.choice([0, 1, 1000])
                rows.append(
                    {
                        "rank": r,
                        "group": rng.choice(["world:0", "tp:1", "tp:1", None]),
                        "ts": ts,
                        "dur": rng.choice([5, 7, 2000, None]),
                        "step": rng.choice([1, 1, 2]),
                    }
                )
        rng.shuffle(rows)
        c = pd.DataFrame(rows, index=rng.sample(range(1000), len(rows)))
        if rng.random() < 0.5:
            c["group"] = c["group"].astype("category")
        transfer, wait = _by_groupby(c)
        partial += bool(transfer.isna().any() and transfer.notna().any())
        pd.testing.assert_series_equal(transfer_dur(c), transfer, check_names=False)
        pd.testing.assert_series_equal(arrival_wait(c), wait, check_names=False)
    assert partial > 20  # positions some members lack were drawn


def _streamed(path: str) -> tuple[str, str]:
    """(`diag analyze --json`'s text: `json_report.write` of `model.document`, its tables written a
    chunk of rows at a time; `json.dump` of the whole plain document, `model.build`, as it was)."""
    trace = load_inputs([path], slim=True)
    metrics = Metrics(trace)
    findings, failures = run_all(trace, None, metrics)
    doc = model.document(trace, findings, failures, metrics)
    assert records.lazy(doc), "the document's tables are written as they are read"
    out = io.StringIO()
    json_report.write(doc, out)
    whole = model.build(trace, findings, failures, metrics)
    assert not records.lazy(whole)
    return out.getvalue(), json.dumps(whole, indent=2, default=str, allow_nan=False) + "\n"


@pytest.mark.parametrize("path", DIAG_DIRS, ids=os.path.basename)
def test_the_json_report_is_written_as_dumped(path, monkeypatch):
    """`diag analyze --json` streams the document (the whole text, and the per-(rank, step) tables as
    dicts, are never held: the run's peak at 64 ranks x 1,000 steps): the same text as `json.dump`
    of the whole document, and a newline; chunks of 3 rows, so that tables span several."""
    monkeypatch.setattr(records, "CHUNK", 3)
    streamed, dumped = _streamed(path)
    assert streamed == dumped
    assert streamed.count("\n") > 100  # indented, as the dumped text


def test_a_tiled_trace_is_written_as_dumped(tmp_path, monkeypatch):
    """The same on bench.analyze's input (3 ranks x 30 steps), in chunks of 7 rows."""
    from bench.analyze import make_diag_input

    monkeypatch.setattr(records, "CHUNK", 7)
    make_diag_input(str(tmp_path), 3, 30)
    streamed, dumped = _streamed(str(tmp_path / "traces"))
    assert streamed == dumped


def test_bandwidth_by_size_scanned_equals_the_groupby(monkeypatch):
    """`breakdown.by_size` (a scan per distinct size) gives the groupby's table, made into the
    document's rows, on random calls: unknown sizes and bandwidths, sizes of 0, ops missing; and
    the groupby itself where the sizes are too many to scan."""
    import random

    import numpy as np

    from diag.metrics import breakdown, positions

    rng = random.Random(7)
    for trial in range(60):
        n = rng.randint(1, 200)
        c = pd.DataFrame(
            {
                "op": pd.Series(
                    [rng.choice(["all_gather", "all_reduce", "broadcast", None]) for _ in range(n)],
                    dtype="category" if trial % 2 else object,
                ),
                "bytes": [
                    rng.choice([0, 256, 4096, 4096, 1 << 20, np.nan if trial % 3 else 8]) for _ in range(n)
                ],
                "busbw": [rng.choice([0.5, 1.25, 3.0, rng.random(), np.nan]) for _ in range(n)],
            }
        )
        codes, ops = positions.coded(c["op"].astype(object) if trial % 2 == 0 else c["op"])
        want = records.Records(breakdown._by_size_groupby(c, codes, ops)).rows()
        assert records.Records(breakdown.by_size(c)).rows() == want
        monkeypatch.setattr(breakdown, "SIZES_SCANNED", 0)
        assert records.Records(breakdown.by_size(c)).rows() == want
        monkeypatch.undo()


def test_a_rank_file_with_no_group_names_gives_the_plain_report(tmp_path, monkeypatch):
    """One rank file names its collectives' groups, the other leaves them null: the joined group
    categorical has missing values, and filling them (`breakdown._rank_stats`) raised a TypeError
    out of `diag analyze` (found while testing worker reads)."""
    import json
    import shutil

    src = os.path.join(ROOT, "sample_traces", "zero3")
    dst = tmp_path / "trace"
    shutil.copytree(src, dst)
    path = dst / "rank-00000.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("k") == "comm":
            rec["group"] = None
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    assert _report(str(dst)) == _plain_report(str(dst), monkeypatch)


def test_filled_text_keeps_a_sorted_categorical():
    from diag.metrics.text import as_text, filled_text

    s = pd.Series(["b", None, "a"], dtype="category")
    filled = filled_text(s, "")
    assert list(filled) == ["b", "", "a"]
    assert as_text(filled) is filled  # still the sorted categorical `as_text` passes through
    plain = filled_text(pd.Series(["b", None], dtype=object), "")
    assert list(plain) == ["b", ""]
