"""The one error type that crosses the CLI boundary.

Anything the user can cause (bad pid, bad file, bad option) is raised as a `DiagError`; the CLI prints
its message on one line, without a traceback, and exits with its code.
"""

from __future__ import annotations

USAGE = 2  # bad input: the convention of argparse and of `diag analyze` on malformed files
FAILURE = 1  # the operation itself failed (injection refused, process gone)


class DiagError(Exception):
    """A user-facing failure: `str(err)` is the one line shown, `exit_code` the process status."""

    def __init__(self, message: str, exit_code: int = USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
