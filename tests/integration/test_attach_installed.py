"""Attach from diag installed as a wheel (non-editable) in its own venv, run from a directory that is
not the checkout (issue 9.1): the raw injector's child used to fail there with "No module named
'diag'" and attach silently fell back to pyinjector, whose dlopen deadlocked a real rank. The venv
(the `venv` fixture): tests/integration/installed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.integration.installed import clean_env, run

pytestmark = pytest.mark.slow

TARGET = r"""
import time, torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
print('ready', flush=True)
while True:
    model(torch.randn(4, 8)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.02)
"""


def test_diag_resolves_into_the_venv_not_the_checkout(venv, tmp_path):
    where = run(
        venv["python"],
        "-c",
        "import diag, diag.collectors, diag.inject.raw as r; "
        "print(diag.__file__); print(diag.collectors.__file__); print(r.__file__)",
        cwd=str(tmp_path),
        env=clean_env(),
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert line.startswith(venv["purelib"] + os.sep), where.stdout


def _events(trace_dir: str) -> list[dict]:
    out = []
    for name in os.listdir(trace_dir) if os.path.isdir(trace_dir) else []:
        with open(os.path.join(trace_dir, name)) as f:
            out.extend(json.loads(line) for line in f if line.endswith("\n"))
    return out


def test_attach_from_an_installed_diag_in_another_directory(venv, tmp_path):
    work = tmp_path / "work"  # the user's own directory: neither the checkout nor the venv
    work.mkdir()
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = clean_env(XDG_RUNTIME_DIR=str(xdg))
    (work / "train.py").write_text(TARGET)
    proc = subprocess.Popen(
        [venv["python"], "train.py"], cwd=str(work), env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        trace = str(tmp_path / "trace")
        res = run(
            venv["diag"],
            "attach",
            str(proc.pid),
            "-v",
            "--what",
            "steps",
            "--trace-dir",
            trace,
            cwd=str(work),
            env=env,
        )
        assert res.returncode == 0, res.stderr
        assert f"attached to pid {proc.pid} via ptrace" in res.stdout, res.stdout
        if sys.version_info < (3, 14):  # -v says why the first method did not run
            assert "method remote_exec failed or skipped: target runs Python" in res.stdout, res.stdout
        assert "warning" not in res.stderr, res.stderr
        deadline = time.monotonic() + 30
        while not any(e.get("k") == "step" for e in _events(trace)):
            assert time.monotonic() < deadline, f"no step events: {_events(trace)}"
            time.sleep(0.1)
        st = run(venv["diag"], "status", str(proc.pid), "--json", cwd=str(work), env=env)
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["trace_dir"] == trace
        gone = run(venv["diag"], "detach", str(proc.pid), cwd=str(work), env=env)
        assert gone.returncode == 0, gone.stderr
        assert proc.poll() is None
        assert sorted(os.listdir(xdg / "diag")) == [], "files left in the private directory"
    finally:
        proc.kill()
        proc.wait()
