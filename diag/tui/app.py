"""`TopApp`: the `diag top` application. It takes its data source as an argument; a worker thread
polls it, aggregates into the `JobModel` and posts typed messages (`ViewUpdated`,
`FindingsUpdated`); the UI thread only applies them, updating table cells in place."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Sparkline, Static
from textual.worker import get_current_worker

from diag.ranks import rank_label, rank_name
from diag.tui import rows
from diag.tui.detail import rank_detail
from diag.tui.pump import Analyze, FindingsUpdated, Pump, ViewUpdated, run_analyzers
from diag.tui.view import JobView, RankRow
from diag.tui.widgets.findings import FindingsPanel
from diag.tui.widgets.panels import PANELS, Panels
from diag.tui.widgets.screens import TextScreen, help_screen
from diag.tui.widgets.table import SyncTable


class TopApp(App[None]):
    TITLE = "diag top"
    CSS = """
    #summary { height: 3; padding: 0 1; }
    #spark { height: 2; margin: 0 1; }
    #panels-box, #panels { height: 1fr; }
    #status { height: 1; padding: 0 1; background: $boost; }
    #finding-detail { height: auto; max-height: 12; padding: 0 1; border-top: solid $accent; }
    #overflow-summary, #gpu-note { height: auto; padding: 0 1; }
    SyncTable { height: 1fr; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("p,space", "pause", "pause"),
        Binding("s", "sort", "sort"),
        Binding("r", "reverse", "reverse", show=False),
        Binding("n", "next_panel", "next panel"),
        *(Binding(str(i + 1), f"panel('{p}')", p, show=False) for i, p in enumerate(PANELS)),
    ]

    def __init__(
        self,
        source: Any,
        *,
        interval: float = 1.0,
        analyze: Analyze | None = run_analyzers,
        analyze_every: float = 10.0,
        notes: tuple[str, ...] = (),
        sidecar: Any = None,
    ) -> None:
        super().__init__()
        self.source, self.notes, self.sidecar = source, list(notes), sidecar
        self.pump = Pump(
            source, self.post_message, interval=interval, analyze=analyze, analyze_every=analyze_every
        )
        self.model, self.lock = self.pump.model, self.pump.lock
        self.paused = False
        self.sort_index, self.sort_reverse = 0, False
        self.view: JobView | None = None
        self._by_key: dict[str, RankRow] = {}  # the ranks table's row keys (rank labels) -> rows
        self._held: JobView | None = None
        self.refreshes = 0
        self.latencies: list[float] = []  # seconds from view built (worker) to shown (UI)
        self.apply_s: list[float] = []  # UI thread: applying one view to the widgets

    def compose(self) -> ComposeResult:
        yield Static(Text(self._waiting()), id="summary")
        yield Sparkline([], id="spark")
        yield Panels(self._gpu_note(), id="panels-box")
        yield Static(Text(self._status()), id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#ranks-table", SyncTable).focus()
        self.run_worker(self._pump, thread=True, exclusive=True, name="top-pump")
        self.set_interval(1.0, self._show_waiting)

    def _waiting(self) -> str:
        return f"{self.source.describe()} | waiting for data"

    def _show_waiting(self) -> None:
        """Until the first rank: say what is waited for (a directory that appears, the first record);
        no new view comes while nothing arrives."""
        if self.view is None:
            self.query_one("#summary", Static).update(Text(self._waiting()))
        elif not self.view.ranks:
            self.query_one("#summary", Static).update(
                Text(rows.summary_text(self.view, self.source.describe()))
            )

    def _pump(self) -> None:
        worker = get_current_worker()
        self.pump.run(lambda: worker.is_cancelled)

    def on_unmount(self) -> None:
        self.pump.stop.set()
        if self.sidecar is not None:
            self.sidecar.stop()

    # ---- UI thread -------------------------------------------------------------------------------
    def on_view_updated(self, msg: ViewUpdated) -> None:
        if self.paused:
            self._held = msg.view
            return
        t0 = time.perf_counter()
        self.apply(msg.view)
        self.apply_s.append(time.perf_counter() - t0)
        self.latencies.append(time.monotonic() - msg.built_at)

    def apply(self, v: JobView) -> None:
        self.view = v
        self.query_one("#summary", Static).update(Text(rows.summary_text(v, self.source.describe())))
        self.query_one("#spark", Sparkline).data = v.step_series
        self._sync_ranks()
        self.query_one(Panels).show(v)
        self.refreshes += 1

    def _sync_ranks(self, force: bool = False) -> None:
        if self.view is None:
            return
        name = list(rows.RANK_SORTS)[self.sort_index]
        by_key = self._by_key = {rank_label(r.rank): r for r in self.view.rank_rows}
        table = self.query_one("#ranks-table", SyncTable)
        changed = table.sync(
            rows.rank_rows(self.view),
            order=lambda k: rows.RANK_SORTS[name](by_key[k]),
            reverse=self.sort_reverse,
        )
        if force and not changed:
            table.sort(key=lambda row: rows.RANK_SORTS[name](by_key[str(row[0])]), reverse=self.sort_reverse)
        self._set_status()

    def on_findings_updated(self, msg: FindingsUpdated) -> None:
        self.query_one(FindingsPanel).show(msg.findings, msg.failures, msg.error)

    def on_data_table_row_selected(self, event: SyncTable.RowSelected) -> None:
        if event.data_table.id != "ranks-table" or event.row_key.value is None:
            return
        row = self._by_key.get(event.row_key.value)  # the key is the rank's label (rows.rank_rows)
        if row is None:
            return
        with self.lock:
            text = rank_detail(self.model, row.rank)
        self.push_screen(TextScreen(text, rank_name(row.rank)))

    def _gpu_note(self) -> str:
        notes = [n for n in self.notes if "GPU" in n]
        return (
            notes[0]
            if notes
            else ("no GPU samples in this trace (the sidecar: python -m diag.nvml <trace-dir>)")
        )

    def _status(self) -> str:
        sort = list(rows.RANK_SORTS)[self.sort_index]
        state = self.view.state if self.view is not None else "live"
        parts = [
            "PAUSED" if self.paused else (state if self.source.live else "replay"),
            f"sort: {sort}{' (reversed)' if self.sort_reverse else ''}",
            *self.notes,
            *(self.view.refused if self.view is not None else ()),
        ]
        return " | ".join(parts)

    def _set_status(self) -> None:
        self.query_one("#status", Static).update(Text(self._status()))

    # ---- actions ---------------------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(help_screen())

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.source.paused = self.paused
        if not self.paused and self._held is not None:
            self.apply(self._held)
            self._held = None
        self._set_status()

    def action_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(rows.RANK_SORTS)
        self._sync_ranks(force=True)

    def action_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._sync_ranks(force=True)

    def action_panel(self, panel: str) -> None:
        self.query_one(Panels).select(panel)

    def action_next_panel(self) -> None:
        self.query_one(Panels).cycle()
