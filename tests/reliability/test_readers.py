"""Hostile inputs to every reader (issue 10): a FIFO or a device named like a rank file, a gzip bomb,
an endless line, values JSON allows but analysis cannot use. Each gives one line naming the file
(and line), exit 2 from `diag analyze`, and the rest of the input is still analyzed; nothing hangs
or grows without bound. The CLI runs in a subprocess with a wall-clock timeout and a 4 GiB address
space limit, so a regression fails fast instead of hanging or eating the machine's memory."""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest

import diag
from diag.importers import load_inputs
from diag.tui.model import JobModel
from diag.tui.source import ReplaySource
from diag.tui.tail import DirTail
from diag.tui.view import build_view
from tests.workloads import launch

SAMPLE = os.path.join(launch.ROOT, "sample_traces", "healthy", "rank-00000.jsonl")
AS_LIMIT = 4 << 30
TIMEOUT_S = 90


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def diag_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return launch.diag_cli(*args, env=env, timeout=TIMEOUT_S, preexec_fn=_limit_memory)


def python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=launch.ROOT,
        env=launch.job_env(env),
        preexec_fn=_limit_memory,
    )


def errors(res: subprocess.CompletedProcess[str], command: str = "analyze") -> list[str]:
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert all(x.startswith(f"diag {command}: error: ") for x in lines), res.stderr[-3000:]
    return lines


@pytest.fixture
def hostile_dir(tmp_path) -> str:
    """A trace directory: one good rank file; a FIFO, a link to /dev/zero and a dangling link
    named as ranks."""
    d = tmp_path / "trace"
    d.mkdir()
    shutil.copy(SAMPLE, d / "rank-00000.jsonl")
    os.mkfifo(d / "rank-00001.jsonl")
    os.symlink("/dev/zero", d / "rank-00002.jsonl")
    os.symlink(str(tmp_path / "gone"), d / "rank-00003.jsonl")
    return str(d)


@pytest.mark.parametrize("how", [[], ["--windowed"]], ids=["whole", "windowed"])
def test_fifo_and_device_rank_files_are_refused_not_read(hostile_dir, how) -> None:
    """Read whole or a window at a time (`--windowed`: each file sized first, `input_bytes`)."""
    res = diag_cli("analyze", "--json", *how, hostile_dir)
    assert res.returncode == 2, res.stderr[-3000:]
    if how:  # (its one line on how the trace was read, then the same errors)
        read, *rest = res.stderr.splitlines(keepends=True)
        assert "steps at a time" in read
        res.stderr = "".join(rest)
    lines = errors(res)
    assert len(lines) == 3
    assert "rank-00001.jsonl: a FIFO, not a regular file: refused" in lines[0]
    assert "rank-00002.jsonl: a character device, not a regular file: refused" in lines[1]
    assert "rank-00003.jsonl: No such file or directory" in lines[2]
    assert json.loads(res.stdout)["ranks"] == [0]  # the good file is still analyzed


def test_export_and_each_reader_refuse_a_fifo(hostile_dir, tmp_path) -> None:
    res = diag_cli("export", "--perfetto", str(tmp_path / "t.json"), hostile_dir)
    assert res.returncode == 2 and len(errors(res, "export")) == 3
    assert os.path.getsize(tmp_path / "t.json") > 0
    # in a child: before the fix each of these blocks forever on the FIFO's open
    code = f"""
import diag
from diag.importers import load_inputs
from diag.tui.tail import DirTail
from diag.tui.source import ReplaySource, _has_pid
d = {hostile_dir!r}
tr = diag.load(d)
print("load", tr.ranks, sorted(str(p) for p in tr.problems))
print("inputs", load_inputs([d + "/rank-00001.jsonl", d]).ranks)
chunks = DirTail(d).poll()
print("tail", sorted((c.path[-16:], c.problem) for c in chunks if c.problem))
print("replay", len(ReplaySource(d, speed=0).poll()), _has_pid(d, 1))
"""
    res = python(code)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "load [0]" in out and "rank-00001.jsonl: a FIFO" in out and "rank-00002.jsonl: a char" in out
    assert "inputs [0]" in out
    assert "('rank-00001.jsonl', 'a FIFO, not a regular file: refused')" in out
    assert "replay" in out


def _bomb(path: str, megabytes: int, byte: bytes = b"\0") -> None:
    zeros = byte * (1 << 20)
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(megabytes):
            f.write(zeros)


def test_gzip_bomb_stops_at_the_input_limit(tmp_path) -> None:
    bomb = str(tmp_path / "rank0.json.gz")
    _bomb(bomb, 256)  # 256 MiB of zeros in ~250 kB
    limit = 16 << 20
    res = diag_cli("analyze", "-q", bomb, SAMPLE, env={"DIAG_MAX_INPUT_BYTES": str(limit)})
    assert res.returncode == 2
    (line,) = errors(res)
    assert line == (
        f"diag analyze: error: {bomb}: decompresses to more than the {limit:,} byte input "
        "limit: refused (DIAG_MAX_INPUT_BYTES raises it)"
    )
    assert "1 rank ·" in res.stdout  # the sample is still analyzed
    # the log importer reads through the same bounded path
    log = str(tmp_path / "train.log")
    _bomb(log, 64, b"x")
    res = diag_cli("analyze", "-q", log, SAMPLE, env={"DIAG_MAX_INPUT_BYTES": str(limit)})
    assert res.returncode == 2 and "input limit: refused" in errors(res)[0]


def test_gzip_members_and_damage(tmp_path) -> None:
    from diag.trace import safeio

    two = tmp_path / "two.gz"
    two.write_bytes(gzip.compress(b"abc") + gzip.compress(b"def") + b"\0" * 8)
    assert safeio.read_limited(str(two)) == b"abcdef"
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(b"x" * 10_000)[:-12])
    with pytest.raises(safeio.InputError, match="truncated or corrupt gzip"):
        safeio.read_limited(str(cut))
    plain = tmp_path / "plain"
    plain.write_bytes(b"y" * 100)
    with pytest.raises(safeio.InputError, match="holds 100 bytes, more than the 99 byte"):
        safeio.read_limited(str(plain), 99)


def test_endless_line_is_skipped_in_bounded_memory(tmp_path, monkeypatch) -> None:
    d = tmp_path / "t"
    d.mkdir()
    with open(SAMPLE, "rb") as f:
        good = f.read()
    with open(d / "rank-00000.jsonl", "wb") as f:
        f.write(good)
        f.write(b'{"k":"step","x":"' + b"z" * (8 << 20))  # 8 MiB, no newline: never ends
    monkeypatch.setenv("DIAG_MAX_LINE_BYTES", str(1 << 20))
    tr = diag.load(str(d))
    (p,) = tr.problems
    assert "skipped a line longer than 1,048,576 bytes" in str(p) and p.line == good.count(b"\n") + 1
    assert len(tr.steps) == len(diag.load(SAMPLE).steps)
    tail = DirTail(str(d))
    while tail.poll():
        pass
    (ft,) = tail.files.values()
    assert ft.skipped == 1 and len(ft.partial) <= 1 << 20


HOSTILE_LINES = [
    (
        "nested",
        b'{"k":"step","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "a record that is nested too deeply",
    ),
    ("nan", b'{"k":"step","step":99,"ts":NaN,"dur":5}', "a record that holds NaN"),
    ("inf", b'{"k":"step","step":99,"ts":1,"dur":Infinity}', "a record that holds Infinity"),
    ("-inf", b'{"k":"comm","step":1,"ts":1,"dur":1,"bytes":-Infinity}', "a record that holds -Infinity"),
    ("overflow", b'{"k":"memory","step":1,"ts":1,"peak":1e999}', "has peak out of range (inf)"),
    ("bigint", b'{"k":"step","step":1,"ts":' + b"9" * 40 + b',"dur":5}', "has ts out of range"),
    ("negative", b'{"k":"step","step":1,"ts":5,"dur":-7}', "a record that has a negative dur (-7)"),
    ("string", b'{"k":"step","step":"x","ts":"abc","dur":"5"}', "has ts that is not a number ('abc')"),
    ("list", b'{"k":"step","step":1,"ts":5,"dur":[]}', "has dur that is not a number ('[]')"),
]


def _with_lines(tmp_path, bad: list[bytes]) -> tuple[str, int]:
    d = tmp_path / "t"
    d.mkdir(exist_ok=True)
    with open(SAMPLE, "rb") as f:
        lines = f.read().splitlines()
    at = len(lines) // 2
    lines[at:at] = bad
    (d / "rank-00000.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return str(d), at + 1


def test_hostile_values_one_line_each_rest_analyzed(tmp_path) -> None:
    d, first = _with_lines(tmp_path, [line for _, line, _ in HOSTILE_LINES])
    res = diag_cli("analyze", "--json", d)
    assert res.returncode == 2
    lines = errors(res)
    assert len(lines) == len(HOSTILE_LINES)
    for i, ((_, _, why), got) in enumerate(zip(HOSTILE_LINES, lines)):
        assert got.startswith(
            f"diag analyze: error: {d}/rank-00000.jsonl:{first + i}: skipped a line that is "
        ), got
        assert why in got, got
    clean = json.loads(diag_cli("analyze", "--json", SAMPLE).stdout)
    assert json.loads(res.stdout)["summary"] == clean["summary"]


def test_hostile_values_in_the_tui(tmp_path) -> None:
    d, _ = _with_lines(tmp_path, [line for _, line, _ in HOSTILE_LINES])
    m = JobModel()
    m.ingest(ReplaySource(d, speed=0).poll())
    view = build_view(m)
    assert m.skipped_lines == len(HOSTILE_LINES)
    assert view.last_ms is not None and view.last_ms > 0


def _kineto(path: str, extra: list[dict]) -> None:
    def ev(name: str, ts: object, dur: object) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}

    events = [ev(f"ProfilerStep#{i}", 1000 + 100 * i, 90) for i in range(5)] + extra
    with open(path, "w") as f:
        json.dump({"distributedInfo": {"rank": 0}, "traceEvents": events}, f, indent=1)


@pytest.mark.parametrize(
    "bad",
    [
        [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#7", "ts": 10**30, "dur": 5, "tid": 1}],
        [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#8", "ts": 2000, "dur": -(10**20), "tid": 1}],
        [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1010, "dur": -5, "tid": 1},
            {
                "ph": "X",
                "cat": "kernel",
                "name": "k",
                "ts": 1e300,
                "dur": 1,
                "tid": 7,
                "args": {"correlation": 10**30, "stream": 7},
            },
        ],
    ],
)
def test_kineto_huge_and_negative_times(tmp_path, bad: list[dict]) -> None:
    path = str(tmp_path / "rank0.json")
    _kineto(path, bad)
    res = diag_cli("analyze", "--json", path)
    assert res.returncode == 2
    (line,) = errors(res)
    assert line.startswith(
        f"diag analyze: error: {path}: skipped {len(bad)} events whose ts or dur is not a time"
    ), line
    tr = load_inputs([path])
    assert len(tr.steps) == 5 and (tr.steps["dur"] == 90_000).all()
    assert (tr.frame("cpu_op")["dur"] >= 0).all()


def test_writer_writes_strict_json_the_reader_accepts(tmp_path) -> None:
    """The reader refuses NaN / Infinity, so the writer must never produce them: a non-finite loss
    scale from the job becomes null, a non-finite config value its text."""
    from diag.trace.writer import TraceFileWriter

    w = TraceFileWriter(str(tmp_path), "rank-00000.jsonl")
    w.write_objects(
        [
            {"k": "header", "schema": 1, "rank": 0, "pid": 1},
            {
                "k": "overflow",
                "step": 1,
                "ts": 5,
                "overflow": True,
                "scale_before": float("inf"),
                "scale_after": 1.0,
            },
            {"k": "meta", "ts": 6, "key": "ds_config", "value": {"clip": float("nan")}},
        ]
    )
    w.close()
    tr = diag.load(str(tmp_path))
    assert not tr.problems
    assert tr.overflow["scale_before"].isna().all() and tr.headers[0]["ds_config"] == {"clip": "nan"}


def test_nothing_readable_still_one_line_per_bad_input(tmp_path) -> None:
    d = tmp_path / "trace"
    d.mkdir()
    os.mkfifo(d / "rank-00001.jsonl")
    os.symlink("/dev/zero", d / "rank-00002.jsonl")
    res = diag_cli("analyze", "-q", str(d), "/dev/null")
    assert res.returncode == 2
    assert [x.split(": ", 3)[2:] for x in errors(res)] == [
        ["/dev/null", "a character device, not a regular file: refused"],
        [f"{d}/rank-00001.jsonl", "a FIFO, not a regular file: refused"],
        [f"{d}/rank-00002.jsonl", "a character device, not a regular file: refused"],
    ]
    res = diag_cli("export", "--perfetto", str(tmp_path / "out.json"), str(d))
    assert res.returncode == 2 and len(errors(res, "export")) == 2
