"""The record kinds the windowed pass never holds whole, and the error a reader of them raises there
(a small module: `analyzers.base` and the report catch it without importing the pass)."""

from __future__ import annotations

from diag import schema

WITHHELD = (schema.COMM, schema.LAYER, schema.COMM_OPEN)  # per call / per layer
_WHAT = {schema.COMM: "call", schema.LAYER: "layer", schema.COMM_OPEN: "entered call"}


class WholeOnly(Exception):
    """A reader of the per-call or per-layer records outside a reduction, under the windowed pass:
    reported not run, never run on a part of its input."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(
            f"not run under the windowed pass: it reads every {_WHAT.get(kind, kind)} record "
            "(--steps A:B analyzes a window of steps whole)"
        )
