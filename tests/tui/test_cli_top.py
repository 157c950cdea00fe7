"""`diag top` command line: argument errors are one line, the source matches the target, and
without a GPU the NVML sidecar gives the one note the UI shows."""

from __future__ import annotations

import argparse
import json

import pytest

from diag.cli import main, top
from diag.errors import DiagError
from diag.tui.source import LiveSource, ReplaySource


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
    assert main(["top", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such trace directory" in err and "Traceback" not in err


def test_no_gpu_note(tmp_path):
    sidecar, notes = top.gpu_sidecar(str(tmp_path))
    if sidecar is not None:
        sidecar.stop()
        pytest.skip(reason="this machine has an NVIDIA GPU")
    assert notes == ["no NVIDIA GPU (NVML not found)"]
