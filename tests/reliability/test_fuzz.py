"""Fuzzing the readers: diag's trace reader, the Kineto importer and the log parser take any bytes
without crashing or hanging; the only failures are `DiagError` / `ImportProblem` or a recorded
`LoadProblem`, each one line, within a time and memory bound (every reader, the TUI's tail and
replay included, for any bytes, plain or gzip). Through the CLI, `diag analyze` answers one line per
bad input, exit 2, no traceback.

Bounded for CI (max_examples, deadline): the whole file runs in well under a minute."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diag
from diag import schema
from diag.cli import main as cli_main
from diag.errors import DiagError
from diag.importers import load_inputs
from diag.importers.errors import ImportProblem
from diag.importers.kineto import import_file
from diag.importers.logs import import_log
from diag.trace.model import Trace
from diag.trace.reader import load_trace, read_file
from tests.workloads import launch

FUZZ = settings(
    max_examples=40, deadline=3000, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64), st.floats(allow_nan=True), st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
kinds = st.sampled_from([*schema.FIELDS, "header", "k", "", "kernel"]) | values
fields = st.sampled_from(
    sorted(
        {f for fs in schema.FIELDS.values() for f in fs}
        | {"rank", "pid", "schema", "world_size", "sidecar", "key", "value"}
    )
)


@st.composite
def records(draw: st.DrawFn) -> bytes:
    obj = draw(st.dictionaries(fields, values, max_size=8))
    obj["k"] = draw(kinds)
    return json.dumps(obj).encode()


lines = st.one_of(records(), st.binary(max_size=40), st.just(b'{"k":"step","ts":1'))
trace_files = (
    st.lists(lines, max_size=12)
    .map(lambda ls: b"\n".join(ls))
    .flatmap(lambda body: st.sampled_from([body, body + b"\n"]))
)


def _write(folder: str, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


@FUZZ
@given(header=records(), body=trace_files)
def test_trace_reader_never_crashes(header: bytes, body: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = _write(
            d, "rank-00000.jsonl", header.replace(b'"k": ', b'"k": "header", "x": ', 1) + b"\n" + body
        )
        read_file(path)
        try:
            assert isinstance(load_trace(d), Trace)
        except DiagError:
            pass


events = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "i", "B"]) | values,
        "cat": st.sampled_from(
            ["kernel", "gpu_memcpy", "cuda_runtime", "cpu_op", "user_annotation", "python_function"]
        )
        | values,
        "name": st.sampled_from(
            [
                "ProfilerStep#3",
                "c10d::allreduce_",
                "nccl:all_reduce",
                "ncclDevKernel_AllReduce",
                "gloo:all_gather",
            ]
        )
        | values,
        "ts": values | st.floats(0, 1e9),
        "dur": values | st.floats(0, 1e6),
        "tid": values,
        "args": values
        | st.dictionaries(
            st.sampled_from(["correlation", "stream", "In msg nelems", "dtype", "Process Group Ranks"]),
            values,
        ),
    },
)
kineto_docs = st.fixed_dictionaries(
    {"traceEvents": st.lists(events, max_size=10)},
    optional={
        "distributedInfo": values
        | st.dictionaries(st.sampled_from(["rank", "world_size", "backend"]), values),
        "deviceProperties": values,
    },
)


@settings(FUZZ)
@given(doc=kineto_docs | values)
def test_kineto_importer_never_crashes(doc: object) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "rank0.json", json.dumps(doc).encode())
        try:
            import_file(path)
        except ImportProblem:
            pass
        try:
            load_inputs([path])
        except DiagError:
            pass


log_lines = st.sampled_from(
    [
        "iteration {a}/ {b} | elapsed time per iteration (ms): {x} | lm loss: {x} | loss scale: {x} |",
        "[Rank {a}] OVERFLOW! Rank {a} Skipping step. Attempted loss scale: {x}, reducing to {x}",
        "[Rank {a}] step={b}, skipped={a}, lr=[{x}]",
        "[Rank {a}] (after {b} iterations) memory (MB) | allocated: {x} | max allocated: {x} |",
        "{t}",
    ]
)


@FUZZ
@given(
    st.lists(
        st.tuples(
            log_lines,
            st.integers(0, 10**12),
            st.integers(0, 10**12),
            st.text(max_size=10),
            st.text(max_size=30),
        ),
        max_size=10,
    ),
    st.binary(max_size=30),
)
def test_log_parser_never_crashes(rows: list, noise: bytes) -> None:
    text = "\n".join(t.format(a=a, b=b, x=x, t=junk) for t, a, b, x, junk in rows).encode() + noise
    with tempfile.TemporaryDirectory() as d:
        try:
            import_log(_write(d, "train.log", text))
        except ImportProblem:
            pass


@settings(
    max_examples=12,
    deadline=10000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(
    name=st.sampled_from(["rank-00000.jsonl", "trace.json", "train.log", "blob"]),
    data=trace_files | st.binary(max_size=200) | kineto_docs.map(lambda d: json.dumps(d).encode()),
)
def test_analyze_cli_in_process(name: str, data: bytes, capsys) -> None:
    with tempfile.TemporaryDirectory() as d:
        code = cli_main(["analyze", "-q", _write(d, name, data)])
    err = capsys.readouterr().err
    assert code in (0, 2)
    assert all(line.startswith("diag analyze: error: ") for line in err.splitlines()), err
    assert (code == 2) == bool(err)


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x01garbage",
        b'{"k":"header","rank":"x","schema":"?"}\n{"k',
        b'{"traceEvents": [{"ph": "X", "cat": "kernel", "args": 3}]}',
    ],
)
def test_analyze_cli_subprocess_says_one_line(tmp_path, data: bytes) -> None:
    path = _write(str(tmp_path), "input.json" if data.startswith(b'{"trace') else "input", data)
    res = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", "-q", path],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=launch.ROOT,
        env=launch.job_env(),
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_atheris_reader_short_run(tmp_path) -> None:
    """Coverage-guided fuzzing of the trace reader for 3000 inputs (optional: needs atheris)."""
    pytest.importorskip("atheris", reason="atheris is not installed (pip install diag[dev])")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability.atheris_reader",
            "-runs=3000",
            f"-artifact_prefix={tmp_path}/",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=launch.ROOT,
        env={**launch.job_env(), "DIAG_FUZZ_DIR": str(tmp_path)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Done 3000 runs" in res.stderr, res.stderr[-2000:]


# ---- every reader, any bytes (issue 10): one line or a result, within a time and memory bound ----

READ_SECONDS = 5.0  # per reader per input (inputs are at most a few kB)
READ_PEAK_BYTES = 64 << 20  # Python-level peak (tracemalloc) per reader per input

hostile_lines = st.sampled_from(
    [
        b'{"k":"step","ts":NaN,"dur":1}',
        b'{"k":"step","ts":1,"dur":-Infinity}',
        b'{"k":"comm","bytes":1e999}',
        b'{"k":"step","ts":' + b"9" * 30 + b"}",
        b'{"k":"step","ts":1,"dur":-5}',
        b'{"k":"step","step":"x","ts":"abc","dur":"5"}',
        b'{"k":"comm","ts":1,"dur":1,"bytes":[1]}',
        b'{"k":"step","x":' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"k":"header","rank":0,"pid":1,"schema":1}',
        b'{"k":"lost","lines":3,"first_step":1,"last_step":2,"error":"ENOSPC"}',
        b"\xff\xfe",
        b"{" * 3000,
    ]
)
any_bytes = st.one_of(
    st.binary(max_size=2048),
    st.lists(hostile_lines | lines, max_size=10).map(b"\n".join),
    kineto_docs.map(lambda d: json.dumps(d).encode()),
    st.builds(
        lambda ts, dur: json.dumps(
            {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur}]}
        ).encode(),
        st.integers(-(2**70), 2**70) | st.floats(),
        st.integers(-(2**70), 2**70) | st.floats(),
    ),
)
maybe_gzipped = st.tuples(any_bytes, st.booleans()).map(lambda t: gzip.compress(t[0]) if t[1] else t[0])


def _bounded(name: str, fn, *expected: type[BaseException]) -> object:
    """Run one reader: its result, or one of `expected` with a one-line message; in bounds."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        return fn()
    except expected as e:
        assert str(e) and "\n" not in str(e), (name, str(e))
        return e
    finally:
        elapsed = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert elapsed < READ_SECONDS, (name, elapsed)
        assert peak < READ_PEAK_BYTES, (name, peak)


def _one_line_problems(trace: object) -> None:
    for p in getattr(trace, "problems", []):
        assert "\n" not in str(p), str(p)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=maybe_gzipped, cut=st.integers(0, 4096))
def test_every_reader_takes_any_bytes_in_bounds(data: bytes, cut: int) -> None:
    from diag.tui.model import JobModel
    from diag.tui.source import ReplaySource
    from diag.tui.tail import DirTail
    from diag.tui.view import build_view

    with tempfile.TemporaryDirectory() as d:
        rank = _write(d, "rank-00000.jsonl", data)
        for name in ("rank0.json", "train.log"):
            _write(d, name, data)
        _one_line_problems(_bounded("diag.load", lambda: diag.load(d), DiagError))
        _bounded("read_file", lambda: read_file(rank))
        _bounded("kineto", lambda: import_file(os.path.join(d, "rank0.json")), ImportProblem)
        _bounded("log", lambda: import_log(os.path.join(d, "train.log")), ImportProblem)
        for name in ("rank0.json", "train.log"):
            _one_line_problems(
                _bounded("load_inputs", lambda n=name: load_inputs([os.path.join(d, n)]), DiagError)
            )

        def tail() -> None:  # the file grows in two parts, cut anywhere (a partial line between)
            _write(d, "rank-00000.jsonl", data[:cut])
            t, m = DirTail(d), JobModel()
            m.ingest(t.poll())
            with open(rank, "ab") as f:
                f.write(data[cut:])
            while chunks := t.poll():
                m.ingest(chunks)
            build_view(m)
            m.to_trace()

        _bounded("tail", tail)
        _bounded("replay", lambda: JobModel().ingest(ReplaySource(d, speed=0).poll()), DiagError)
