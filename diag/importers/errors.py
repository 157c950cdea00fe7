"""The one exception importers raise for an unreadable input: its text is the one-line reason."""

from __future__ import annotations


class ImportProblem(ValueError):
    """A file that cannot be imported; `str()` says what is wrong (the caller adds the path)."""
