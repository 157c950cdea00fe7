"""The tabbed panels: ranks, collectives, layers, overflow / loss scale, GPUs, findings. `show()`
syncs every table but the ranks one (the app sorts that one by the user's choice)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static, TabbedContent, TabPane

from diag.tui import fmt, rows
from diag.tui.view import JobView
from diag.tui.widgets.findings import FindingsPanel
from diag.tui.widgets.table import SyncTable

PANELS = ("ranks", "collectives", "layers", "overflow", "gpus", "findings")


def _index(keys: dict[str, Any]) -> Callable[[str], int]:
    """Sort order = the order the view produced (by time, newest first, ...)."""
    pos = {k: i for i, k in enumerate(keys)}
    return lambda k: pos.get(k, len(pos))


class Panels(Vertical):
    """A container around the TabbedContent `#panels` (whose own compose must not be replaced)."""

    def __init__(self, gpu_note: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gpu_note = gpu_note

    def compose(self) -> ComposeResult:
        with TabbedContent(initial="ranks", id="panels"):
            yield from self._panes()

    def _panes(self) -> ComposeResult:
        with TabPane("Ranks 1", id="ranks"):
            yield SyncTable(rows.RANK_COLUMNS, id="ranks-table")
        with TabPane("Collectives 2", id="collectives"):
            yield SyncTable(rows.COMM_COLUMNS, id="comm-table")
        with TabPane("Layers 3", id="layers"):
            yield SyncTable(rows.LAYER_COLUMNS, id="layer-table")
        with TabPane("Overflow 4", id="overflow"):
            yield Static("", id="overflow-summary")
            yield SyncTable(rows.OVERFLOW_COLUMNS, id="overflow-table")
        with TabPane("GPUs 5", id="gpus"):
            yield Static(Text(self.gpu_note), id="gpu-note")
            yield SyncTable(rows.GPU_COLUMNS, id="gpu-table")
        with TabPane("Findings 6", id="findings"):
            yield FindingsPanel(id="findings-panel")

    def show(self, v: JobView) -> None:
        for table, cells in (
            ("#comm-table", rows.comm_rows(v)),
            ("#layer-table", rows.layer_rows(v)),
            ("#overflow-table", rows.overflow_rows(v)),
        ):
            self.query_one(table, SyncTable).sync(cells, order=_index(cells))
        self.query_one("#overflow-summary", Static).update(
            Text(
                f"loss scale {fmt.num(v.loss_scale, 0)}, skipped steps {v.skipped_steps}, steps with "
                f"an overflow {v.overflow_steps}"
            )
        )
        gpus = rows.gpu_rows(v)
        self.query_one("#gpu-note", Static).update(Text("" if gpus else self.gpu_note))
        self.query_one("#gpu-table", SyncTable).sync(gpus, order=_index(gpus))

    def select(self, panel: str) -> None:
        self.query_one("#panels", TabbedContent).active = panel
        self.query_one(f"#{panel} SyncTable", SyncTable).focus()

    def cycle(self) -> None:
        active = self.query_one("#panels", TabbedContent).active
        self.select(PANELS[(PANELS.index(active) + 1) % len(PANELS)])
