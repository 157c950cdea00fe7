"""diag's rank files read in worker processes (`trace.rankfiles`, issue 14) give what the in-process
reading gives: the same frames, headers and problems (file, line, message, order), with a window,
with bad lines, where a rank comes from two files, and where the files' columns are `Uneven`. Small
traces, and 2 cores, do not start workers by default: the tests force them (`DIAG_WORKERS=2`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator

import pandas as pd
import pytest

from diag.trace import perfile, rankfiles, reader, workers
from diag.trace.window import ALL, Window
from tests.conftest import ROOT, sample_folders

DIAG_DIRS = [d for d in sample_folders() if any(f.endswith(".jsonl") for f in os.listdir(d))]


@pytest.fixture
def forked(monkeypatch):
    """Workers for any input, as many cores as they need; the list of pools started (their sizes)."""
    monkeypatch.delenv(workers.ENV, raising=False)
    monkeypatch.setattr(rankfiles, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(workers, "cores", lambda: rankfiles.MIN_CORES)
    pools: list[int] = []
    real = workers.forked_map

    def counted(fn, items, n, per_child=4):
        pools.append(n)
        return real(fn, items, n, per_child)

    monkeypatch.setattr(workers, "forked_map", counted)
    return pools


@contextlib.contextmanager
def _workers(cap: str) -> Iterator[None]:
    """`DIAG_WORKERS=cap` meanwhile."""
    old = os.environ.get(workers.ENV)
    os.environ[workers.ENV] = cap
    try:
        yield
    finally:
        if old is None:
            del os.environ[workers.ENV]
        else:
            os.environ[workers.ENV] = old


def _load(path: str, window: Window = ALL, *, strict: bool = False, in_workers: bool) -> reader.Trace:
    with _workers("2" if in_workers else "0"):
        return reader.load_trace(path, strict=strict, window=window)


def _same(path: str, window: Window = ALL) -> reader.Trace:
    """Loads `path` both ways and checks they agree; the workers' trace."""
    alone = _load(path, window, in_workers=False)
    forked = _load(path, window, in_workers=True)
    assert [(p.path, p.line, p.message, p.truncated) for p in forked.problems] == [
        (p.path, p.line, p.message, p.truncated) for p in alone.problems
    ]
    assert forked.headers == alone.headers
    assert list(forked.headers) == list(alone.headers)
    assert sorted(forked.frames) == sorted(alone.frames)
    for kind, df in alone.frames.items():
        pd.testing.assert_frame_equal(forked.frames[kind], df, check_categorical=True)
    return forked


@pytest.mark.parametrize("path", DIAG_DIRS, ids=os.path.basename)
def test_workers_read_every_sample_as_the_main_process_does(path, forked):
    _same(path)
    assert forked == ([2] if len(reader.trace_files(path)) > 1 else []), "not read in workers"


def _damaged(tmp_path) -> str:
    """zero3's two rank files with bad lines, a truncated end, rank 1's collectives of no group
    (an all-None column beside two files' categoricals), a pid- file of rank 0 (a restarted rank:
    the rank file's meta joins its header, so the rank file is read again in-process) and an NVML
    sidecar; still joined file by file (not `Uneven`)."""
    out = tmp_path / "damaged"
    shutil.copytree(os.path.join(ROOT, "sample_traces", "zero3"), out)
    r0 = out / "rank-00000.jsonl"
    lines = r0.read_bytes().splitlines(keepends=True)
    lines[5:5] = [b"{not json\n", b'{"k": 3}\n', b"[1, 2]\n"]
    r0.write_bytes(b"".join(lines))
    r1 = out / "rank-00001.jsonl"
    records = [json.loads(line) for line in r1.read_bytes().splitlines()]
    for rec in records:
        if rec["k"] == "comm":
            rec["group"] = None
    r1.write_text("".join(json.dumps(rec) + "\n" for rec in records) + '{"k":"comm","op":"all_reduce","ts":1')
    header = lines[0].replace(b'"pid":379', b'"pid":99').replace(b'"rank":0,', b'"rank":null,')
    comm = next(line for line in lines if b'"k":"comm"' in line).replace(b'"group":"1"', b'"group":"before"')
    (out / "pid-99.jsonl").write_bytes(
        header
        + b'{"k":"meta","ts":1,"key":"rank","value":0}\n{"k":"meta","ts":2,"key":"late","value":"x"}\n'
        + comm
    )
    (out / "gpu-vm.jsonl").write_bytes(
        b'{"k":"header","schema":1,"sidecar":"nvml","host":"vm","pid":7}\n{"k":"gpu","ts":5,"gpu":0,"util":50}\n'
    )
    with _workers("0"):  # raises Uneven where it is not joined file by file
        reader._load(str(out), False, ALL, perfile.PerFile())
    return str(out)


def test_bad_lines_and_a_rank_of_two_files_read_the_same(tmp_path, forked):
    trace = _same(_damaged(tmp_path))
    assert forked == [2]
    assert any(p.line == 6 and "not valid JSON" in p.message for p in trace.problems)
    assert any(p.truncated for p in trace.problems)
    assert trace.headers[0]["pid"] == 99 and trace.headers[0]["late"] == "x"  # the pid- file's, first
    assert trace.comms.groupby("rank", observed=True)["group"].count().to_dict() == {0: 317, 1: 0}
    assert "gpu" in trace.frames


@pytest.mark.parametrize(
    "window", [Window(frozenset({1}), None, None), Window(None, 2, 4)], ids=["ranks", "steps"]
)
def test_a_window_reads_the_same(tmp_path, forked, window):
    trace = _same(_damaged(tmp_path), window)
    assert forked == [2]  # --ranks 1: rank-00000 not opened, the pid- file read and dropped
    if window.steps:
        assert set(trace.steps["step"]) == {2, 3}


def test_chunks_taken_in_a_worker_read_the_same(tmp_path, forked, monkeypatch):
    """bench.analyze's input (the real ZeRO-3 run tiled) in chunks of 500 records, so each worker
    turns a file into frames chunk by chunk and renames the groups of its first chunks at its end."""
    from bench.analyze import make_diag_input

    monkeypatch.setattr(reader, "CHUNK", 500)
    make_diag_input(str(tmp_path), 3, 30)
    _same(str(tmp_path / "traces"))
    assert forked == [2]


def test_strict_stops_at_the_first_problem_in_workers_too(tmp_path, forked):
    path = _damaged(tmp_path)
    with pytest.raises(reader.DiagError) as alone:
        _load(path, strict=True, in_workers=False)
    with pytest.raises(reader.DiagError) as forked_err:
        _load(path, strict=True, in_workers=True)
    assert str(forked_err.value) == str(alone.value)


def test_uneven_files_in_workers_fall_back_to_the_joint_reading(tmp_path, forked, monkeypatch):
    """A file whose records cannot be framed alone (`Uneven` in the worker): every file is read
    together, as the in-process reading does."""
    path = _damaged(tmp_path)
    real_add = perfile.PerFile.add

    def uneven_for_rank_1(self, by_kind):
        if any(ev.get("rank") == 1 for rows in by_kind.values() for ev in rows):
            raise perfile.Uneven("rank 1")
        real_add(self, by_kind)

    monkeypatch.setattr(perfile.PerFile, "add", uneven_for_rank_1)
    _same(path)
    assert forked == [2]


def test_workers_follow_the_cores_given_and_the_users_cap(monkeypatch, tmp_path):
    files = []
    for i in range(8):
        f = tmp_path / f"rank-{i:05d}.jsonl"
        f.write_bytes(b"x" * 1000)
        files.append(str(f))
    monkeypatch.delenv(workers.ENV, raising=False)
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert workers.cores() == 3
    assert workers.workers_for(files, 0, 2, 0) == 3  # the affinity's cores, not the machine's
    assert workers.workers_for(files, 0, 3, 1) == 2  # Kineto's: a core left to the main process
    assert workers.workers_for(files, 10_000, 2, 0) == 0  # under the size where workers pay
    assert workers.workers_for(files[:1], 0, 2, 0) == 0
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert workers.workers_for(files, 0, 2, 0) == workers.MAX_WORKERS
    for value, n in (
        ("0", 0),
        ("1", 1),
        ("6", 6),
        ("lots", workers.MAX_WORKERS),
        ("-1", workers.MAX_WORKERS),
    ):
        monkeypatch.setenv(workers.ENV, value)
        assert workers.workers_for(files, 0, 2, 0) == n, value
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setenv(workers.ENV, "4")
    assert workers.workers_for(files, 0, 2, 0) == 0  # one core given: no worker, whatever the cap


def test_a_column_of_no_value_from_a_worker_still_joins_as_missing():
    """A frame sent back from a worker holds another instance of numpy's object dtype: its column of
    no value still counts as missing, and the files' categoricals are united, not joined as strings."""
    import pickle

    held = pd.DataFrame({"group": pd.Categorical(["tp", "dp"])})
    sent = pickle.loads(pickle.dumps(pd.DataFrame({"group": [None, None]}, dtype=object)))
    assert list(perfile._categories([held, sent], "group")) == ["dp", "tp"]
