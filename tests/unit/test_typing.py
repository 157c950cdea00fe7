"""mypy, strict, over the typed scope pyproject's [tool.mypy] names (the agent, the collectors, the
injectors, control, trace, stacks, the core and most CLI commands): any error fails the suite."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install diag[dev])"
)
@pytest.mark.timeout(600)  # ~15 s without a cache on an idle machine; 3.5 min measured on a loaded one
def test_the_typed_scope_has_no_mypy_errors() -> None:
    res = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "typecheck.py")],
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found" in res.stdout


def test_the_package_says_it_is_typed() -> None:
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["diag"]
    assert os.path.isfile(os.path.join(ROOT, "diag", "py.typed"))
