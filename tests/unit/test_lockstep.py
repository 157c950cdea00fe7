"""`trace.lockstep` (issue 14): each window of steps read from every rank file at once is the trace
`load_trace` gives for that window (frames, headers, layout, hosts), the windows' and `outside`'s
rows are the whole trace's, row for row, and the problems are `load_trace`'s, once. On every diag
sample and fixture, a tiled trace, a damaged one, and crafted files (a rank that died early, gaps
in the steps, records out of step order, calls outside every step, a group renamed late)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections import Counter
from typing import Any

import pandas as pd
import psutil
import pytest

from diag.errors import DiagError
from diag.trace import reader, shards
from diag.trace.lockstep import AHEAD, AHEAD_MIN, AHEAD_TOTAL, LockStep, OutOfStep, Part, ahead_for
from diag.trace.window import ALL, Window
from tests.conftest import ROOT
from tests.unit.test_rankfiles import DIAG_DIRS, _damaged

BIG = 100_000  # a window larger than any job here


@pytest.fixture(autouse=True)
def _one_file_a_run(monkeypatch) -> None:
    """A worker makes frames of each of its files' window on its own (`shards.CHUNK_RECORDS`): its
    runs of files joined in file order, as its shards are in the main process."""
    monkeypatch.setattr(shards, "CHUNK_RECORDS", 1)


def _problems(problems: list[reader.LoadProblem]) -> list[tuple[Any, ...]]:
    return [(p.path, p.line, p.message, p.truncated) for p in problems]


def _same_trace(got: reader.Trace, want: reader.Trace) -> None:
    assert got.headers == want.headers and list(got.headers) == list(want.headers)
    assert got.layout() == want.layout() and got.hosts() == want.hosts() and got.ranks == want.ranks
    assert sorted(got.frames) == sorted(want.frames)
    for kind, df in want.frames.items():
        pd.testing.assert_frame_equal(got.frames[kind], df, check_categorical=True, obj=kind)


def _stepped(df: pd.DataFrame) -> pd.Series:
    """Rows of an integer step (those a step window filters)."""
    if "step" not in df.columns:
        return pd.Series(False, index=df.index)
    return pd.to_numeric(df["step"], errors="coerce").notna()


def _rows(df: pd.DataFrame) -> Counter[tuple[str, ...]]:
    """Each row as its values' text (lists of group ranks included), counted; a missing value is
    None or NaN by the frame's dtype, a whole number 3 or 3.0 (a window's column may hold no gap)."""
    df = df[sorted(df.columns)]  # (a window's columns come in its records' order)
    return Counter(tuple(map(_cell, row)) for row in df.itertuples(index=False))


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return repr(value)
    if pd.isna(value):
        return "missing"
    if isinstance(value, float) and value.is_integer():
        return repr(int(value))
    return repr(value)


def _check(
    path: str, size: int, window: Window = ALL, ahead: int = AHEAD, compare: int = 4, workers: int = 1
) -> list[Part]:
    """Reads `path` a window at a time and checks the contract against `load_trace`: every row,
    and the first and last `compare` / 2 windows whole (each a `load_trace` of the files)."""
    reading = LockStep(path, size, window, ahead=ahead, workers=0)
    parts = list(reading)
    # one worker: the sample's files (2 or more) are its runs (`_one_file_a_run`); more: its shards
    _same_in_workers(LockStep(path, size, window, ahead=ahead, workers=workers), reading, parts)
    whole = reader.load_trace(path, window=window)
    for prev, part in itertools.pairwise(parts):
        assert prev.window.hi is not None and part.window.lo is not None and prev.window.hi <= part.window.lo
    for i, part in enumerate(parts):
        lo, hi = part.window.lo, part.window.hi
        assert lo is not None and hi is not None and 0 < hi - lo <= size and part.window.ranks == window.ranks
        assert window.hi is None or hi <= window.hi
        if i < compare // 2 or i >= len(parts) - compare // 2:
            _same_trace(part.trace, reader.load_trace(path, window=part.window))
        assert part.trace.problems == []  # reported once, after the windows
    assert _problems(reading.problems) == _problems(whole.problems)
    outside = reading.outside
    assert outside is not None and _problems(outside.problems) == _problems(whole.problems)
    assert outside.headers == whole.headers
    for kind in set(whole.frames) | set(outside.frames) | {k for p in parts for k in p.trace.frames}:
        df = whole.frames.get(kind, pd.DataFrame())
        steps = [p.trace.frames[kind] for p in parts if kind in p.trace.frames]
        steps += [outside.frames[kind]] if kind in outside.frames else []
        joined = pd.concat([f[_stepped(f)] for f in steps]) if steps else pd.DataFrame()
        assert _rows(joined) == _rows(df[_stepped(df)]), f"{kind}: the windows' rows are not the trace's"
        still = outside.frames.get(kind, pd.DataFrame())
        assert _rows(still[~_stepped(still)]) == _rows(df[~_stepped(df)]), kind
    return parts


def _same_in_workers(sharded: LockStep, reading: LockStep, parts: list[Part]) -> None:
    """`sharded` (files read in forked workers: `trace.shards`) gives `reading`'s windows, outside
    and problems, and leaves no worker behind."""
    before = _children()
    got = list(sharded)
    assert [p.window for p in got] == [p.window for p in parts]
    for mine, theirs in zip(got, parts):
        _same_trace(mine.trace, theirs.trace)
        assert _problems(mine.trace.problems) == _problems(theirs.trace.problems)
    assert _problems(sharded.problems) == _problems(reading.problems)
    assert sharded.outside is not None and reading.outside is not None
    _same_trace(sharded.outside, reading.outside)
    assert _problems(sharded.outside.problems) == _problems(reading.outside.problems)
    assert _children() <= before


def _children() -> set[int]:
    """This process' children (another test's may outlive it: only new ones are the reading's)."""
    return {c.pid for c in psutil.Process().children()}


@pytest.mark.parametrize("path", DIAG_DIRS, ids=os.path.basename)
def test_every_sample_read_three_steps_at_a_time_is_load_trace(path):
    _check(path, 3)


@pytest.mark.parametrize("size", [1, 2, 7, BIG])
@pytest.mark.parametrize("name", ["zero3", "repro_tiny_collectives", "megatron_tp2"])
def test_window_sizes(name, size):
    parts = _check(os.path.join(ROOT, "sample_traces", name), size)
    steps = set(reader.load_trace(os.path.join(ROOT, "sample_traces", name)).steps["step"])
    assert len(parts) == (1 if size == BIG else len({(s - min(steps)) // size for s in steps}))


@pytest.fixture(scope="module")
def tiled(tmp_path_factory) -> str:
    """bench.analyze's input: the real ZeRO-3 run tiled to 3 ranks x 24 steps."""
    from bench.analyze import make_diag_input

    folder = tmp_path_factory.mktemp("tiled")
    make_diag_input(str(folder), 3, 24)
    return str(folder / "traces")


@pytest.mark.parametrize("size", [1, 2, 3, 7, BIG])
def test_a_tiled_trace(tiled, size):
    parts = _check(tiled, size, compare=2)
    assert len(parts) == -(-24 // size)


def test_a_damaged_trace_reports_what_load_trace_reports_once(tmp_path):
    """Bad lines, a truncated end, a rank of two files (a pid- file learns its rank from meta), an
    NVML sidecar."""
    path = _damaged(tmp_path)
    for size in (1, 3, BIG):
        _check(path, size)
    reading = LockStep(path, 2)
    list(reading)
    assert any(p.truncated for p in reading.problems) and any(p.line == 6 for p in reading.problems)


def test_rank_and_step_windows(tmp_path):
    path = _damaged(tmp_path)
    _check(path, 2, Window(frozenset({1}), None, None))
    parts = _check(path, 2, Window(None, 1, 4))
    assert [(p.window.lo, p.window.hi) for p in parts] == [(1, 3), (3, 4)]
    assert _check(path, 2, Window(frozenset({7}), None, None)) == []  # no such rank


def test_strict_raises_what_load_trace_raises(tmp_path):
    path = _damaged(tmp_path)
    with pytest.raises(DiagError) as whole:
        reader.load_trace(path, strict=True)
    with pytest.raises(DiagError) as windows:
        list(LockStep(path, 2, strict=True))
    assert str(windows.value) == str(whole.value)
    assert len(list(LockStep(os.path.join(ROOT, "sample_traces", "zero3"), 2, strict=True))) == 3


def _records(path: str) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        return [json.loads(line) for line in f]


def _write(path: str, records: list[dict[str, Any]], tail: bytes = b"") -> None:
    with open(path, "wb") as f:
        f.write(b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records) + tail)


def test_ranks_of_different_steps_and_gaps(tiled, tmp_path):
    """Rank 2 died at step 6 (its last line cut); steps 9-16 missing from every rank: the window
    in the gap is skipped."""
    path = str(tmp_path / "t")
    shutil.copytree(tiled, path)
    for name in sorted(os.listdir(path)):
        recs = [r for r in _records(os.path.join(path, name)) if not 9 <= r.get("step", -1) < 17]
        if name == "rank-00002.jsonl":
            recs = [r for r in recs if r.get("step", 0) < 6]
        _write(os.path.join(path, name), recs, b'{"k":"comm","step":5,"op"' if "00002" in name else b"")
    parts = _check(path, 4, compare=BIG)
    assert [p.window.lo for p in parts] == [0, 4, 8, 16, 20]
    assert sorted(parts[0].trace.steps["rank"].unique()) == [0, 1, 2]
    assert sorted(parts[-1].trace.steps["rank"].unique()) == [0, 1]
    _check(path, 1, compare=2)
    _check(path, 5, Window(None, 7, 22), compare=2)


def test_a_single_step_a_pid_file_and_calls_outside_every_step(tmp_path):
    """One step, and calls of step -1 (before it and after it): in no window, in `outside`; a pid-
    file whose rank comes as meta."""
    src = _records(os.path.join(ROOT, "sample_traces", "zero3", "rank-00000.jsonl"))
    one = [r for r in src if r.get("step", 0) == 0]
    comm = next(r for r in one if r["k"] == "comm")
    header = dict(one[0], rank=None, pid=4242)
    _write(
        str(tmp_path / "pid-4242.jsonl"),
        [
            header,
            {"k": "meta", "ts": 1, "key": "rank", "value": 3},
            dict(comm, step=-1),
            *one[1:],
            dict(comm, step=-1),
        ],
    )
    parts = _check(str(tmp_path), 1)
    assert [(p.window.lo, p.window.hi) for p in parts] == [(0, 1)] and parts[0].trace.ranks == [3]
    reading = LockStep(str(tmp_path), 5)
    list(reading)
    assert reading.outside is not None and list(reading.outside.comms["step"]) == [-1, -1]


def test_records_written_late_find_their_window(tiled, tmp_path):
    """A layer record written after later steps' calls, within `ahead` records: still in its window;
    beyond it, `OutOfStep` (the caller then reads the trace whole)."""
    path = str(tmp_path / "t")
    shutil.copytree(tiled, path)
    name = os.path.join(path, "rank-00000.jsonl")
    recs = _records(name)
    late = next(i for i, r in enumerate(recs) if r["k"] == "layer" and r["step"] == 3)
    moved = recs.pop(late)
    after = max(i for i, r in enumerate(recs) if r.get("step") == 5)
    recs.insert(after + 1, moved)
    _write(name, recs)
    between = sum(1 for r in recs[late : after + 1] if r.get("step", 0) >= 4)
    _check(path, 4, ahead=between + 1, compare=2)  # read on until the late record is read
    before = _children()
    for workers in (0, 2):
        with pytest.raises(OutOfStep):
            list(LockStep(path, 4, ahead=between, workers=workers))  # the window given before it comes
    assert _children() <= before
    _check(path, 2, ahead=between + 1, compare=2)


def test_the_look_ahead_is_shared_by_the_files():
    """A file's look-ahead is its share of `AHEAD_TOTAL` (1,024 records each at 1,024 ranks held a
    1,024 x 16 trace's whole input as dicts), never under `AHEAD_MIN` nor over `AHEAD`."""
    assert ahead_for(8) == AHEAD and ahead_for(1) == AHEAD
    assert ahead_for(256) == AHEAD_TOTAL // 256 > AHEAD_MIN
    assert ahead_for(1_024) == ahead_for(100_000) == AHEAD_MIN
    assert all(ahead_for(n) * n <= max(AHEAD_TOTAL, AHEAD_MIN * n) for n in (1, 64, 65, 512, 4_096))


def test_a_group_renamed_at_the_files_end_is_renamed_in_the_first_window(tmp_path):
    """The agent names a group by its role after its first collectives (`groups` meta, `renamed`):
    `load_trace` renames the file's every call, so the first window must know the file's end."""
    src = os.path.join(ROOT, "sample_traces", "zero3")
    shutil.copytree(src, tmp_path / "z")
    name = str(tmp_path / "z" / "rank-00000.jsonl")
    recs = _records(name)
    recs.append({"k": "meta", "ts": 2, "key": "groups", "value": {"1": {"renamed": "dp"}}})
    _write(name, recs)
    parts = _check(str(tmp_path / "z"), 2)
    comms = parts[0].trace.comms
    assert set(comms[comms["rank"] == 0]["group"].astype(str)) >= {"dp"}


def test_a_window_must_hold_a_step():
    with pytest.raises(DiagError):
        LockStep(os.path.join(ROOT, "sample_traces", "zero3"), 0)


def test_read_again_gives_the_same_windows():
    reading = LockStep(os.path.join(ROOT, "sample_traces", "zero3"), 2)
    first = [(p.window, sorted(p.trace.frames)) for p in reading]
    headers = reading.headers
    assert [(p.window, sorted(p.trace.frames)) for p in reading] == first and reading.headers == headers


def test_a_file_of_no_header_and_a_stepped_line_of_no_step(tmp_path):
    """A file of no header is reported as `load_trace` reports it; a writer's comm line that holds
    no step (it would be in every window, yet the first pass left it) is `OutOfStep`."""
    shutil.copytree(os.path.join(ROOT, "sample_traces", "zero3"), tmp_path / "z")
    (tmp_path / "z" / "rank-00009.jsonl").write_bytes(b'{"k":"meta","ts":1,"key":"x","value":1}\n')
    _check(str(tmp_path / "z"), 2)
    name = str(tmp_path / "z" / "rank-00001.jsonl")
    recs = _records(name)
    _write(name, [*recs, {"k": "comm", "op": "barrier", "ts": 9}])
    for workers in (0, 2):
        with pytest.raises(OutOfStep):
            list(LockStep(str(tmp_path / "z"), 2, workers=workers))


def test_workers_whose_frames_cannot_be_joined_hand_over_to_the_main_process(tiled, tmp_path):
    """A field of numbers in one shard's window and of text in another's: one frame of all their
    records holds both (objects), the shards' frames cannot be joined (`Uneven`); the windows from
    there on are read in-process, the same as ever."""
    path = str(tmp_path / "t")
    shutil.copytree(tiled, path)
    for name, value in (("rank-00000.jsonl", 1), ("rank-00002.jsonl", "a")):
        recs = _records(os.path.join(path, name))
        _write(os.path.join(path, name), [dict(r, x=value) if r.get("step") == 5 else r for r in recs])
    parts = _check(path, 2, compare=BIG)
    assert parts[2].window.lo == 4
    assert set(parts[2].trace.steps["x"].dropna()) == {1, "a"}


def test_a_kind_of_a_window_that_a_shard_holds_only_outside_every_step(tiled, tmp_path):
    """Rank 0 overflows at step 5; rank 2's one overflow record carries no step (in every window):
    the window of step 5 holds both, whichever worker read rank 2's file."""
    path = str(tmp_path / "t")
    shutil.copytree(tiled, path)
    name = os.path.join(path, "rank-00000.jsonl")
    recs = _records(name)
    at = next(i for i, r in enumerate(recs) if r["k"] == "step" and r["step"] == 5)
    flag = {
        "k": "overflow",
        "ts": recs[at]["ts"],
        "overflow": True,
        "scale_before": 1024.0,
        "scale_after": 512.0,
    }
    _write(name, [*recs[: at + 1], dict(flag, step=5), *recs[at + 1 :]])
    name = os.path.join(path, "rank-00002.jsonl")
    _write(name, [*_records(name), {"ts": flag.pop("ts"), **flag}])  # (not the writer's line: read first)
    for workers in (1, 2):  # rank 2's file a run of a worker's, then a shard of its own
        parts = _check(path, 2, compare=BIG, workers=workers)
        assert sorted(parts[2].trace.frames["overflow"]["rank"]) == [0, 2]


def test_a_reading_left_early_ends_its_workers(tiled):
    before = _children()
    windows = iter(LockStep(tiled, 2, workers=2))
    first = next(windows)
    assert first.window.lo == 0 and len(_children() - before) == 2
    windows.close()  # type: ignore[attr-defined]
    assert _children() <= before


def test_a_worker_killed_is_one_clear_error(tiled):
    from diag.trace.shards import WorkerError

    before = _children()
    windows = iter(LockStep(tiled, 2, workers=2))
    next(windows)
    for pid in _children() - before:
        psutil.Process(pid).kill()
    with pytest.raises(WorkerError, match="DIAG_WORKERS=0"):
        list(windows)
    assert _children() <= before


def test_workers_end_when_the_main_process_dies(tiled, tmp_path):
    """Killed (the OOM killer), the main process leaves its workers nothing to read: they end."""
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import os, psutil, signal; from diag.trace.lockstep import LockStep\n"
        f"w = iter(LockStep({tiled!r}, 1, workers=2)); next(w)\n"
        "print(' '.join(str(c.pid) for c in psutil.Process().children()), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
