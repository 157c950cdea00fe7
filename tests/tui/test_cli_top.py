"""`diag top` command line: argument errors are one line, the source matches the target, and
without a GPU the NVML sidecar gives the one note the UI shows."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from diag.cli import main, top
from diag.errors import DiagError
from diag.tui.source import LiveSource, ReplaySource
from tests.conftest import ROOT


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    top.add_arguments(p)
    return p.parse_args(list(argv))


def _trace(tmp_path):
    (tmp_path / "rank-00000.jsonl").write_text(json.dumps({"k": "header", "rank": 0}) + "\n")
    return str(tmp_path)


def test_resolve_sources(tmp_path):
    d = _trace(tmp_path)
    src, path = top.resolve(_args(d))
    assert isinstance(src, LiveSource) and path == d
    src, _ = top.resolve(_args(d, "--replay", "--speed", "4"))
    assert isinstance(src, ReplaySource) and src.speed == 4
    with pytest.raises(DiagError, match="speed"):
        top.resolve(_args(d, "--replay", "--speed", "-1"))
    with pytest.raises(DiagError, match="not a pid"):
        top.resolve(_args("1", "--replay"))


def test_bad_target_is_one_line(tmp_path, capsys):
    assert main(["top", "--replay", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file or directory" in err and "Traceback" not in err


def test_no_gpu_note(tmp_path):
    sidecar, notes = top.gpu_sidecar(str(tmp_path))
    if sidecar is not None:
        sidecar.stop()
        pytest.skip(reason="this machine has an NVIDIA GPU")
    assert notes == ["no NVIDIA GPU (NVML not found)"]


AGENT_JOB = (
    "import sys, time, diag.agent; diag.agent.start(trace_dir=sys.argv[1], what='memory'); "
    "print('ready', flush=True); time.sleep(60)"
)


def _launch(code: str, *argv: str, rank: bool) -> subprocess.Popen:
    """A job whose agent runs in-process (no control socket); `rank=False`: behind a launcher
    process, as torchrun starts ranks (RANK in the rank's environment only)."""
    if rank:
        cmd = [sys.executable, "-c", code, *argv]
    else:
        inner = (
            "import os, subprocess, sys; "
            "subprocess.run([sys.executable, '-c', sys.argv[1], *sys.argv[2:]], "
            "env={**os.environ, 'RANK': '0'})"
        )
        cmd = [sys.executable, "-c", inner, code, *argv]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "DIAG_TRACE_DIR")}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)


@pytest.mark.parametrize("rank", [True, False], ids=["rank-pid", "launcher-pid"])
def test_top_pid_of_an_in_process_agent_or_its_launcher(tmp_path, rank):
    trace = tmp_path / "elsewhere"
    job = _launch(AGENT_JOB, str(trace), rank=rank)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        src, path = top.resolve(_args(str(job.pid)))
        assert isinstance(src, LiveSource) and path == str(trace)
    finally:
        job.kill()
        job.wait()


def test_no_such_process_and_no_such_directory_exit_alike(tmp_path, capsys):
    dead = subprocess.Popen(["true"])
    dead.wait()
    for argv in (["top", str(dead.pid)], ["status", str(dead.pid)], ["top", "--replay", str(tmp_path / "x")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("no such process" in err or "no such file" in err), err


def test_a_file_is_not_a_trace_directory(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert main(["top", str(tmp_path / "f")]) == 2
    assert "not a trace directory" in capsys.readouterr().err


def test_status_of_a_launcher_asks_its_ranks(tmp_path, capsys):
    code = AGENT_JOB.replace("what='memory'", "what='memory', control=True")
    job = _launch(code, str(tmp_path), rank=False)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        assert main(["status", str(job.pid)]) == 0
        out = capsys.readouterr().out
        assert f"trace {tmp_path}/rank-00000.jsonl" in out and f"pid {job.pid}" not in out, out
    finally:
        job.kill()
        job.wait()
