"""The one exception importers raise for an unreadable input: its text is the one-line reason."""

from __future__ import annotations


class ImportProblem(ValueError):
    """A file that cannot be imported; `str()` says what is wrong (the caller adds the path).
    `problems` (LoadProblems), when given, replace that one line: a directory of several bad files."""

    def __init__(self, message: str, problems: list | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []
