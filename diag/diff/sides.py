"""Load one side of a diff: a diag trace folder, Kineto trace files/folders or logs of ONE run.

Garbage is refused with one line naming the side: an input that cannot be read, nothing timed, or
two runs mixed into one side (two diag trace folders, two Kineto traces of one rank).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diag.errors import DiagError

if TYPE_CHECKING:
    from diag.trace.model import Trace


def _runs(paths: list[str]) -> int:
    """How many diag trace folders the inputs hold (each one is a whole run)."""
    from diag.importers import detect, input_files

    items, _ = input_files(paths)
    return sum(1 for _, kind in items if kind == detect.DIAG)


def load_side(label: str, paths: list[str]) -> Trace:
    """One side's Trace, or a `DiagError` whose message starts with the side's label."""
    from diag.importers import load_inputs

    if _runs(paths) > 1:
        raise DiagError(
            f"{label}: {len(paths)} inputs hold more than one diag trace folder: "
            "a side must be one run (mixed runs are refused)"
        )
    try:
        trace = load_inputs(paths)
    except DiagError as e:
        raise DiagError(f"{label}: {e}") from None
    if trace.problems:  # analyze reads around a bad input; a diff of half a run would mislead
        raise DiagError(f"{label}: {str(trace.problems[0]).removesuffix(' (skipped)')}")
    from diag.diff import adapter

    if adapter.step_times(trace).empty:
        raise DiagError(f"{label}: no timed steps in {', '.join(paths)} (nothing to compare)")
    return trace
