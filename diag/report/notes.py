"""The report's lines on what the analysis did not do (every renderer prints the same words): a
rule that raised, a rule the windowed pass did not run, the sections it made without the call and
layer records (`model.document`'s `windowed`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_NOT_RUN = "not run under the windowed pass"


def rule_lines(
    doc: dict[str, Any], name: Callable[[str], str] = str, text: Callable[[str], str] = str
) -> list[str]:
    """One line a rule that raised or was not run (`name` formats its name, `text` the reason);
    then one for the partial sections."""
    out = [
        f"rule {name(k)}: {text(v)}" if v.startswith(_NOT_RUN) else f"rule {name(k)} failed: {text(v)}"
        for k, v in doc["rule_failures"].items()
    ]
    partial = (doc.get("windowed") or {}).get("partial")
    if partial:
        out.append(
            "read a window of steps at a time (--windowed): made without the call and layer records, "
            f"as if none were recorded: {', '.join(partial)}"
        )
    return out
