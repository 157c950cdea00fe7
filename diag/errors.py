"""The one error type that crosses the CLI boundary.

Anything the user can cause (bad pid, bad file, bad option) is raised as a `DiagError`; the CLI prints
its message on one line, without a traceback, and exits with its code.
"""

from __future__ import annotations

USAGE = 2  # bad input: a bad option (argparse's convention), a malformed file, a path or pid that does
# not exist ("no such file or directory", "no such process"): every command alike
FAILURE = (
    1  # the operation on a target that exists failed (injection refused, not attached, exited meanwhile)
)


class DiagError(Exception):
    """A user-facing failure: `str(err)` is the one line shown, `exit_code` the process status."""

    def __init__(self, message: str, exit_code: int = USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
