"""The one error type that crosses the CLI boundary.

Anything the user can cause (bad pid, bad file, bad option) is raised as a `DiagError`; the CLI prints
its message on one line, without a traceback, and exits with its code.
"""

from __future__ import annotations

USAGE = 2  # bad input: a bad option (argparse's convention), a malformed file, a path or pid that does
# not exist ("no such file or directory", "no such process"): every command alike
# a missing third-party module -> the extra that installs it (pyproject.toml's optional-dependencies)
EXTRAS = {
    "pandas": "analyze",
    "rich": "analyze",
    "orjson": "analyze",
    "psutil": "attach",
    "py_spy": "attach",
    "textual": "tui",
    "prometheus_client": "prometheus",
}


def needs(e: ModuleNotFoundError) -> str:
    """'needs X, which is not installed: pip install 'diag[extra]'' for a missing optional module."""
    extra = EXTRAS.get((e.name or "").split(".")[0])
    how = f": pip install 'diag[{extra}]'" if extra else ""
    return f"needs {e.name}, which is not installed{how}"


FAILURE = (
    1  # the operation on a target that exists failed (injection refused, not attached, exited meanwhile)
)


class DiagError(Exception):
    """A user-facing failure: `str(err)` is the one line shown, `exit_code` the process status."""

    def __init__(self, message: str, exit_code: int = USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
