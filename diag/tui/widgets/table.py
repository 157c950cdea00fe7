"""`SyncTable`: a DataTable updated in place from keyed rows, so a 1 Hz refresh of 1,024 ranks
touches only the cells whose text changed instead of rebuilding the table.

A column is only ever widened, and only by a cell wider than it: DataTable re-measures a whole
column for every updated cell narrower than the column (`update_width=True`), which at 1,024 rows
x 8 changing columns is 8 million measurements per refresh.

A widened column takes its new width at once, not at the table's next idle as DataTable does: its
render caches are keyed by an update count that the widening at idle does not renew, so a cell
painted between the update and the idle stayed cut to the column's old width until the table's
next update (in a finished replay, for good: "straggler, slow x1.6," for "straggler, slow x1.6,
overflow 1", 5 in 90 snapshot runs at load 10)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable


class SyncTable(DataTable):
    """Columns fixed at construction; `sync({key: cells})` adds, updates and removes rows."""

    def __init__(self, columns: Sequence[str], **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._columns = list(columns)
        self._cells: dict[str, tuple[str, ...]] = {}
        self.cell_updates = 0  # cells rewritten since start (bench / tests)

    def on_mount(self) -> None:
        for name in self._columns:
            self.add_column(name, key=name)

    def sync(
        self,
        rows: dict[str, tuple[str, ...]],
        order: Callable[[str], Any] | None = None,
        reverse: bool = False,
    ) -> bool:
        """Make the table show `rows` (in `order` of their keys); True if anything changed."""
        changed = False
        for key in [k for k in self._cells if k not in rows]:
            self.remove_row(key)
            del self._cells[key]
            changed = True
        for key, cells in rows.items():
            old = self._cells.get(key)
            if old is None:
                self.add_row(*(Text(c) for c in cells), key=key)  # plain text, never markup
                changed = True
            elif old != cells:
                for col, new, was in zip(self._columns, cells, old):
                    if new != was:
                        # a column widens when a cell outgrows it (replay's first rows are placeholders)
                        column = self.columns[col]  # type: ignore[index]
                        wider = cell_len(new) > column.content_width
                        if wider:  # before the update, which renews the render caches (see above)
                            column.content_width = cell_len(new)
                        self.update_cell(key, col, Text(new), update_width=wider)
                        self.cell_updates += 1
                changed = True
            self._cells[key] = cells
        if order is not None and changed:
            self.sort(key=lambda row: order(self._key_of(row)), reverse=reverse)
        return changed

    def _key_of(self, row: Sequence[Any]) -> str:
        """Rows are sorted on their full cell list; the first cell is the row key by convention."""
        return str(row[0])
