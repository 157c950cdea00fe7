"""`diag diff` as users run it (a subprocess): the three outputs, and one line + exit 2 for every
kind of bad side (missing, empty, garbage, half-readable, two runs mixed, nothing timed)."""

from __future__ import annotations

import json
import os
import subprocess
from fractions import Fraction

import pytest

from tests.unit.kineto_samples import CPU_RANKS, GPU_RANKS, ROOT
from tests.workloads import launch

S = os.path.join(ROOT, "sample_traces")
HEALTHY, ZERO3 = os.path.join(S, "healthy"), os.path.join(S, "zero3")


def _diag(*args: str) -> subprocess.CompletedProcess[str]:
    return launch.diag_cli("diff", *args, env={"COLUMNS": "160"}, timeout=180)


def test_terminal_json_markdown_html(tmp_path):
    md, page = tmp_path / "d.md", tmp_path / "d.html"
    r = _diag(HEALTHY, ZERO3, "--json", "--markdown", str(md), "--html", str(page))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["schema"], doc["version"]) == ("diag.diff", 1)
    parts = doc["waterfall"]["parts"]
    assert sum(Fraction(p["delta_ns_exact"]) for p in parts) == Fraction(doc["waterfall"]["total_ns_exact"])
    assert "all_gather (ZeRO-3 parameter gathers" in md.read_text()
    assert "<table>" in page.read_text() and "Where the time went" in page.read_text()
    t = _diag(HEALTHY, ZERO3)
    assert t.returncode == 0 and "Where the time went" in t.stdout and "cause: +" in t.stdout


def _log(path, ms: list[float], skipped: list[int]) -> str:
    """Megatron's iteration line format (as tests/unit/test_logs.py quotes it from a real run)."""
    lines = [
        f" [2025-10-06 03:27:{i:02d}] iteration {i + 1:7d}/ 20 | consumed samples: {512 * (i + 1)} | "
        f"elapsed time per iteration (ms): {t} | learning rate: 1.5E-06 | global batch size: 512 | "
        f"lm loss: 9.7E+00 | loss scale: 65536.0 | number of skipped iterations: {s:3d} | "
        "number of nan iterations:   0 |"
        for i, (t, s) in enumerate(zip(ms, skipped))
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_logs_compare_with_skipped_iterations(tmp_path):
    a = _log(tmp_path / "a.log", [100.0, 100.0, 100.0, 100.0], [0, 0, 0, 0])
    b = _log(tmp_path / "b.log", [110.0, 130.0, 110.0, 110.0], [0, 1, 0, 0])
    doc = json.loads(_diag(a, b, "--json").stdout)
    parts = {p["label"]: p["delta_ms"] for p in doc["waterfall"]["parts"]}
    assert doc["waterfall"]["total_ms"] == pytest.approx(15.0)
    assert parts == pytest.approx({"other": -17.5, "skipped": 32.5})  # one of four steps skipped
    assert doc["baseline"]["throughput"]["samples_per_s"] == pytest.approx(5120.0)


def _bad_bin(tmp_path):
    p = tmp_path / "bin.dat"
    p.write_bytes(bytes(range(256)) * 8)
    return [str(p)]


def _empty(tmp_path):
    (tmp_path / "empty").mkdir()
    return [str(tmp_path / "empty")]


def _half(tmp_path):  # one good rank file and one garbage file: refused, not half a run
    p = tmp_path / "x.json"
    p.write_text('{"traceEvents": [{"ph": "X",')
    return [CPU_RANKS[0], str(p), "--vs", HEALTHY]


BAD = {
    "missing": (lambda t: ["/nonexistent/run", HEALTHY], "baseline: /nonexistent/run: no such file"),
    "empty": (lambda t: [HEALTHY, *_empty(t)], "candidate: "),
    "binary": (lambda t: [HEALTHY, *_bad_bin(t)], "binary file"),
    "half": (_half, "invalid JSON"),
    "two diag runs": (lambda t: [HEALTHY, "--vs", ZERO3, HEALTHY], "mixed runs are refused"),
    "two traces of one rank": (
        lambda t: [CPU_RANKS[0], GPU_RANKS[0], "--vs", HEALTHY],
        "different runs",
    ),  # a rank twice: two captures, never merged
    "nothing timed": (lambda t: [HEALTHY, os.path.join(S, "fp16_overflow", "job.log")], "no timed steps"),
    "three paths": (lambda t: [HEALTHY, ZERO3, HEALTHY], "expected BASELINE CANDIDATE"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_side_is_one_line_exit_2(tmp_path, case):
    make, reason = BAD[case]
    r = _diag(*make(tmp_path))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert len(lines) == 1 and lines[0].startswith("diag diff: error: ") and reason in lines[0], r.stderr
