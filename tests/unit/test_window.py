"""`diag analyze --ranks / --steps`: a window of the job, the rest not read (ranks) or not kept
(steps), on the real sample traces (a 2-rank GPU-shaped Kineto run, a 2-rank ZeRO-3 diag trace)."""

from __future__ import annotations

import gzip
import os
import shutil

import pytest

from diag.cli import main
from diag.errors import DiagError
from diag.importers import load_inputs
from diag.trace.reader import read_file
from diag.trace.window import ALL, kineto_rank, parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KINETO = os.path.join(ROOT, "sample_traces", "kineto_gloo_dp")
ZERO3 = os.path.join(ROOT, "sample_traces", "zero3")


def _kineto_pair(tmp_path) -> list[str]:
    return [shutil.copy(os.path.join(KINETO, f"gpu-rank{r}.json.gz"), tmp_path) for r in (0, 1)]


def _broken_after_head(src: str, dst: str) -> None:
    """`dst`: `src`'s head (its distributedInfo) followed by junk: readable only up front."""
    with gzip.open(src, "rb") as f:
        head = f.read(2000)
    with open(dst, "wb") as f:
        f.write(head[: head.index(b'"traceEvents"')] + b'"traceEvents": [{"ph": "X", broken')


def test_parse_ranks_and_steps() -> None:
    w = parse("0-2,7", "10:20")
    assert w.ranks == frozenset({0, 1, 2, 7}) and (w.lo, w.hi) == (10, 20)
    assert parse(None, "5:").hi is None and parse(None, ":5").lo is None
    assert not parse(None, None) and not ALL
    for ranks, steps in (("x", None), ("3-1", None), (",", None), (None, "5:3"), (None, "a:b"), (None, "4")):
        with pytest.raises(DiagError):
            parse(ranks, steps)


def test_kineto_rank_outside_the_window_is_not_read(tmp_path) -> None:
    r0, r1 = _kineto_pair(tmp_path)
    broken = str(tmp_path / "gpu-rank0.json")
    _broken_after_head(r0, broken)
    os.remove(r0)
    assert kineto_rank(broken) == 0 and kineto_rank(r1) == 1
    full = load_inputs([str(tmp_path)])
    assert any(p.path == broken for p in full.problems)  # read without a window: it is broken
    one = load_inputs([str(tmp_path)], window=parse("1", None))
    assert one.ranks == [1] and not one.problems and one.sources == [r1]


def test_kineto_steps_window_keeps_only_its_steps(tmp_path) -> None:
    paths = _kineto_pair(tmp_path)
    full = load_inputs(paths)
    win = load_inputs(paths, window=parse(None, "3:5"))
    assert sorted(set(win.steps["step"])) == [3, 4]
    for kind in ("kernel", "cpu_op", "comm", "step"):
        f, w = full.frame(kind), win.frame(kind)
        want = f[f["step"].isin([3, 4])].reset_index(drop=True)
        assert len(w) == len(want) > 0, kind
        assert (w["ts"].to_numpy() == want["ts"].to_numpy()).all(), kind


def test_diag_trace_ranks_and_steps(tmp_path) -> None:
    d = tmp_path / "zero3"
    shutil.copytree(ZERO3, d)
    (d / "rank-00000.jsonl").write_text("not a trace\n")  # reported when read
    assert load_inputs([str(d)]).problems
    one = load_inputs([str(d)], window=parse("1", "2:4"))
    assert one.ranks == [1] and not one.problems
    assert sorted(set(one.steps["step"])) == [2, 3]
    assert set(one.comms["step"].dropna()) <= {2, 3} and len(one.comms)
    assert set(one.comms["rank"]) == {1}


def test_diag_rank_file_keeps_only_the_window_steps_as_it_reads(tmp_path) -> None:
    """The step cut is made line by line (a 10,000-step rank file read for 20 steps holds those
    steps' records, not the file's); records without a step (meta, NVML) and the problems stay."""
    path = os.path.join(ZERO3, "rank-00001.jsonl")
    cut = tmp_path / "rank-00001.jsonl"
    with open(path, "rb") as f:
        cut.write_bytes(f.read() + b'{"k": "step", "step": 9')  # killed mid-write
    header, events, problems = read_file(str(cut))
    h2, in_window, p2 = read_file(str(cut), parse(None, "2:4"))
    assert h2 == header and [str(p) for p in p2] == [str(p) for p in problems] and problems
    assert in_window == [e for e in events if e.get("step") in (2, 3) or "step" not in e]
    assert {e.get("step") for e in in_window} >= {2, 3, None} and len(in_window) < len(events)


def test_cli_window_errors_are_one_line(tmp_path, capsys) -> None:
    paths = _kineto_pair(tmp_path)
    assert main(["analyze", "-q", "--ranks", "5", *paths]) == 2
    assert main(["analyze", "-q", "--steps", "9:3", *paths]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "diag analyze: error: nothing to analyze in the --ranks/--steps window",
        "diag analyze: error: --steps: '9:3' selects no step (B must be greater than A)",
    ]
