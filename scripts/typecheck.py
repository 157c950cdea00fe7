"""Run mypy on the typed scope (pyproject's [tool.mypy]): python scripts/typecheck.py [mypy args].

`collectors/` imports as `diag.collectors` (pyproject's package-dir; diag/__init__.py extends the
package path in a checkout), a mapping mypy cannot follow. So mypy runs over a throwaway tree of
symbolic links laid out as the wheel installs: diag/<each entry>, diag/collectors, diag/analyzers.
Exit status and output are mypy's, with paths shown as in the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSIDE = {"collectors": "collectors", "analyzers": "analyzers"}  # package-dir: diag.<name> = <folder>


def shadow_tree(dest: str) -> None:
    """`dest/diag` with a link per entry of diag/ and the package-dir folders inside it."""
    pkg = os.path.join(dest, "diag")
    os.mkdir(pkg)
    for entry in os.listdir(os.path.join(ROOT, "diag")):
        if entry != "__pycache__":
            os.symlink(os.path.join(ROOT, "diag", entry), os.path.join(pkg, entry))
    for name, folder in INSIDE.items():
        os.symlink(os.path.join(ROOT, folder), os.path.join(pkg, name))


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="diag-mypy-") as tmp:
        shadow_tree(tmp)
        cmd = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            os.path.join(ROOT, "pyproject.toml"),
            "--cache-dir",
            os.path.join(ROOT, ".mypy_cache"),
            *argv,
        ]
        res = subprocess.run(
            cmd,
            cwd=tmp,
            capture_output=True,
            text=True,
            env={**os.environ, "MYPYPATH": tmp, "PYTHONPATH": ""},
        )
        for stream, text in ((sys.stdout, res.stdout), (sys.stderr, res.stderr)):
            stream.write(
                text.replace("diag/collectors/", "collectors/").replace("diag/analyzers/", "analyzers/")
            )
        return res.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
