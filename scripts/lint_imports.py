"""Check the layering contracts of pyproject.toml (`[tool.importlinter]`): python scripts/lint_imports.py.

import-linter reads the package from the file system, and in a checkout `diag.collectors` and
`diag.analyzers` live beside `diag/` (pyproject's package-dir; diag/__init__.py joins them at run
time), so `lint-imports` run in the checkout stops at "Module 'diag.analyzers' does not exist".
This lays the tree out as the wheel installs it, in a throwaway folder (a copy: import-linter does
not follow symbolic links to folders), and lints that. Exit status and output are lint-imports'.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSIDE = ("collectors", "analyzers")  # package-dir: diag.<name> = <folder>


def installed_layout(dest: Path) -> Path:
    """`dest/diag` as a wheel lays it out: diag/ with the package-dir folders copied inside."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "diag", dest / "diag", ignore=skip)
    for name in INSIDE:
        shutil.copytree(ROOT / name, dest / "diag" / name, ignore=skip)
    return dest


def lint(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """lint-imports with the checkout's contracts over `tree` (this copy, not an installed diag)."""
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "importlinter.cli"]
    return subprocess.run(
        [*cmd, str(ROOT / "pyproject.toml"), "--no-cache", *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="diag-layers-") as tmp:
        out = lint(installed_layout(Path(tmp)), *argv)
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
