"""diag installed as a wheel (non-editable) in a venv of its own, for the tests that run it from outside
the checkout (test_attach_installed, test_run_installed; the `venv` fixture of conftest.py builds it
once a session).

The venv is made with `python -m venv --without-pip`; diag goes in with `pip install --no-deps` of a
wheel built from this checkout (no network: `--no-build-isolation --no-index`); torch, psutil and
the rest come from this interpreter's site-packages through a plain path `.pth` line (which does not
run that site-packages' own `.pth` files, so its editable diag stays out)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def run(*cmd: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=180, **kw)


def build_venv(tmp: Path) -> dict[str, str]:
    """A fresh venv in `tmp` holding only the diag wheel: its python, diag script and site-packages
    (skips where no wheel can be built offline)."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("diag", "collectors", "analyzers"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    built = run(
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
    made = run(sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv"))
    assert made.returncode == 0, made.stderr
    python = str(tmp / "venv" / "bin" / "python")
    purelib = run(
        python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", env=clean_env()
    ).stdout.strip()
    installed = run(
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
        env=clean_env(),
    )  # PYTHONPATH would satisfy it
    assert installed.returncode == 0, installed.stderr
    outer = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    with open(os.path.join(purelib, "zz_outer_site.pth"), "w") as f:  # torch, psutil, ...: not diag
        f.write("\n".join(outer) + "\n")
    return {"python": python, "diag": str(tmp / "venv" / "bin" / "diag"), "purelib": purelib, "tmp": str(tmp)}
