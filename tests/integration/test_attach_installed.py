"""Attach from diag installed as a wheel (non-editable) in its own venv, run from a directory that is
not the checkout (issue 9.1): the raw injector's child used to fail there with "No module named
'diag'" and attach silently fell back to pyinjector, whose dlopen deadlocked a real rank.

The venv is made with `python -m venv --without-pip`; diag goes in with `pip install --no-deps` of a
wheel built from this checkout (no network: `--no-build-isolation --no-index`); torch, psutil and
the rest come from this interpreter's site-packages through a plain path `.pth` line (which does not
run that site-packages' own `.pth` files, so its editable diag stays out)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time

import pytest

from tests.conftest import ROOT

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


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _run(*cmd: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=180, **kw)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> dict[str, str]:
    """A fresh venv holding only the diag wheel; yields its python, diag script and site-packages."""
    tmp = tmp_path_factory.mktemp("installed")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("diag", "collectors", "analyzers"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    built = _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(tmp / "dist"),
        str(src),
    )
    if built.returncode != 0 and "setuptools" in built.stderr:
        pytest.skip(reason=f"cannot build a wheel offline here: {built.stderr.strip()[-300:]}")
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").iterdir()
    made = _run(sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv"))
    assert made.returncode == 0, made.stderr
    python = str(tmp / "venv" / "bin" / "python")
    purelib = _run(
        python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", env=_clean_env()
    ).stdout.strip()
    installed = _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        "-q",
        str(wheel),
        env=_clean_env(),
    )  # PYTHONPATH would satisfy it
    assert installed.returncode == 0, installed.stderr
    outer = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    with open(os.path.join(purelib, "zz_outer_site.pth"), "w") as f:  # torch, psutil, ...: not diag
        f.write("\n".join(outer) + "\n")
    return {"python": python, "diag": str(tmp / "venv" / "bin" / "diag"), "purelib": purelib, "tmp": str(tmp)}


def test_diag_resolves_into_the_venv_not_the_checkout(venv, tmp_path):
    where = _run(
        venv["python"],
        "-c",
        "import diag, diag.collectors, diag.inject.raw as r; "
        "print(diag.__file__); print(diag.collectors.__file__); print(r.__file__)",
        cwd=str(tmp_path),
        env=_clean_env(),
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
    env = _clean_env(XDG_RUNTIME_DIR=str(xdg))
    (work / "train.py").write_text(TARGET)
    proc = subprocess.Popen(
        [venv["python"], "train.py"], cwd=str(work), env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        trace = str(tmp_path / "trace")
        res = _run(
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
        st = _run(venv["diag"], "status", str(proc.pid), "--json", cwd=str(work), env=env)
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["trace_dir"] == trace
        gone = _run(venv["diag"], "detach", str(proc.pid), cwd=str(work), env=env)
        assert gone.returncode == 0, gone.stderr
        assert proc.poll() is None
        assert sorted(os.listdir(xdg / "diag")) == [], "files left in the private directory"
    finally:
        proc.kill()
        proc.wait()
