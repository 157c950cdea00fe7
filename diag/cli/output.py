"""Writing a report file the user named: one line naming the path when it cannot be written."""

from __future__ import annotations

from diag.errors import DiagError


def write_report(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise DiagError(f"{path}: cannot write report ({e.strerror or e})") from None
