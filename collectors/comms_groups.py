"""Process-group identity for comm records: name, size and global ranks, resolved once per group.

Cached by `id(pg)` with a weak reference to check identity, so a destroyed group is neither kept
alive nor confused with a new one that reuses its address.
"""

from __future__ import annotations

import weakref
from typing import Any

GroupInfo = tuple[str, int, "tuple[int, ...] | None"]


def describe(pg: Any) -> GroupInfo:
    """(name, size, global ranks). The name is c10d's group_name: the same on every member rank."""
    import torch.distributed as dist

    name = str(getattr(pg, "group_name", "") or pg.name())
    size = int(pg.size())
    try:
        ranks: tuple[int, ...] | None = tuple(int(r) for r in dist.get_process_group_ranks(pg))
    except Exception:  # noqa: BLE001 - a group c10d does not track (made by hand): ranks unknown
        ranks = None
    return name, size, ranks


class Groups:
    """`info(pg)` is one dict lookup and one weakref call on the hot path."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[weakref.ref, GroupInfo]] = {}

    def info(self, pg: Any) -> GroupInfo:
        hit = self._cache.get(id(pg))
        if hit is not None and hit[0]() is pg:
            return hit[1]
        info = describe(pg)
        self._cache[id(pg)] = (weakref.ref(pg), info)
        return info

    def clear(self) -> None:
        self._cache.clear()
