"""SyncTable on its own: what it paints after a cell outgrows its column."""

from __future__ import annotations

from textual.app import App, ComposeResult

from diag.tui.widgets.table import SyncTable
from tests.tui.conftest import screen_text, sync


class _One(App):
    def compose(self) -> ComposeResult:
        yield SyncTable(["rank", "health"], id="t")


@sync
async def test_a_widened_cell_is_painted_whole_once_the_table_is_idle():
    """A paint between the update and the table's idle (under load, the screen's refresh can come
    first) must not leave the cell cut at the column's old width: DataTable widens at idle without
    renewing its render caches, which held the cut cell until the next update."""
    app = _One()
    async with app.run_test(size=(80, 10)) as pilot:
        table = app.query_one("#t", SyncTable)
        table.sync({"5": ("5", "slow x1.6")})
        await pilot.pause()
        table.sync({"5": ("5", "straggler, slow x1.6, overflow 1")})
        screen_text(app)  # painted before the table's idle
        await pilot.pause()
        await pilot.pause()
        assert "straggler, slow x1.6, overflow 1" in screen_text(app)
