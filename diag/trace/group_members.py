"""A call's group ranks where its line omits them (`comm_line`: the agent writes a large group's
ranks on its first call of each step, not on every call).

Every reader of a rank file fills them the same way, in file order: the whole read
(`reader.read_file`), the windowed pass's (`stepfile`) and the live tail (`tui.tail`). A window of
steps holds the line that carried them: the writer omits them only after a line of the same step
and group that had them."""

from __future__ import annotations

from typing import Any

from diag import schema

_KEY = "group_ranks"


class Fill:
    """One file's groups' ranks as last written (by the group's name, as the line spells it)."""

    def __init__(self) -> None:
        self._ranks: dict[Any, Any] = {}

    def __call__(self, rec: dict[str, Any]) -> None:
        """Give `rec` (a collective's record) its group's ranks where its line omitted them."""
        if rec.get("k") != schema.COMM:
            return
        group = rec.get("group")
        try:
            if _KEY in rec:
                self._ranks[group] = rec[_KEY]
            elif group in self._ranks:
                rec[_KEY] = self._ranks[group]
        except TypeError:  # (a group named by a list: not the agent's, no ranks omitted)
            return
