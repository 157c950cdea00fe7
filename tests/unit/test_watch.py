"""`diag watch --json`: each new or changed finding once, one JSON line, with rank, group, collective,
step and time; a cleared one once; bad input is one line and a non-zero exit."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from diag.cli.watch import Stream
from diag.findings import Finding
from tests.unit.synth_trace import Job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _f(ranks: list[int], severity: str = "critical", step: int = 7) -> Finding:
    return Finding(
        rule="hang_desync",
        severity=severity,
        title=f"hang at step {step}",
        detail="",
        evidence={"group": "world", "collective": "all_reduce", "step": step},
        ranks=ranks,
    )


def test_stream_prints_each_new_changed_and_cleared_finding_once():
    out = io.StringIO()
    s = Stream(out, as_json=True)
    assert s.update([_f([1])]) == 1
    assert s.update([_f([1], step=8)]) == 0  # same verdict, a number in it moved: not news
    assert s.update([_f([0, 1])]) == 1
    assert s.update([_f([0, 1], severity="info")]) == 1  # below warning: gone from the stream
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["new", "changed", "cleared"]
    first = lines[0]
    assert (first["rule"], first["ranks"], first["group"], first["collective"], first["step"]) == (
        "hang_desync",
        [1],
        "world",
        "all_reduce",
        7,
    )
    assert first["time"] > 1.7e9 and first["since_start_s"] >= 0


def _watch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diag", "watch", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_watch_json_on_a_trace_directory(tmp_path):
    job = Job(steps=8)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=10 if r == 0 else 70, dur_ms=65 if r == 0 else 5))
    job.write(str(tmp_path / "slow"))
    res = _watch(str(tmp_path / "slow"), "--json", "--duration", "1.5", "--interval", "0.5")
    assert res.returncode == 0, res.stderr
    (line,) = [json.loads(x) for x in res.stdout.splitlines()]
    assert (line["event"], line["rule"], line["ranks"]) == ("new", "straggler", [1])
    healthy = Job(steps=8)
    healthy.each_step(lambda r, s: healthy.comm(r, s))
    healthy.write(str(tmp_path / "ok"))
    res = _watch(str(tmp_path / "ok"), "--json", "--duration", "1.5", "--interval", "0.5")
    assert res.returncode == 0 and res.stdout == "", res.stdout + res.stderr


def test_watch_bad_input_is_one_line(tmp_path):
    res = _watch(str(tmp_path / "missing"), "--json", "--duration", "1")
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = _watch(str(tmp_path), "--interval", "0")
    assert res.returncode != 0 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
