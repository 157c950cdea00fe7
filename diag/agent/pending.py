"""Values a hook cannot know yet: a GPU duration measured by CUDA events that have not completed.

A hook puts a `Pending` into its record instead of a number; the writer thread holds such a record
back until `ready()` (never synchronizing the device), then writes `value()`. After `MAX_HOLD_S` a
still-pending value is written as null and counted, so a stuck stream cannot grow memory forever.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

MAX_HOLD_S = 10.0


class Pending(ABC):
    """Base class: subclasses answer `ready()` cheaply and `value()` once ready."""

    __slots__ = ()

    @abstractmethod
    def ready(self) -> bool:
        """True once the value can be read without waiting (e.g. `event.query()`)."""

    @abstractmethod
    def value(self) -> Any:
        """The resolved value; only called after `ready()` returned True."""


_PENDING: set[type] = set()  # types seen so far, sorted once (an ABC isinstance costs ~1 us a field)
_PLAIN: set[type] = set()


def _pending_types(rec: tuple[Any, ...]) -> set[type]:
    """The Pending types among the record's fields (empty for most records)."""
    types = set(map(type, rec))
    for kind in types - _PLAIN - _PENDING:
        (_PENDING if issubclass(kind, Pending) else _PLAIN).add(kind)
    return types & _PENDING


def unresolved(rec: tuple[Any, ...]) -> bool:
    """True when some field of the record is a Pending that is not ready yet."""
    pending = _pending_types(rec)
    return bool(pending) and any(type(v) in pending and not v.ready() for v in rec)


def resolve(rec: tuple[Any, ...], give_up: bool = False) -> tuple[Any, ...]:
    """The record with every Pending replaced by its value (or None when giving up)."""
    pending = _pending_types(rec)
    if not pending:
        return rec
    return tuple((None if give_up and not v.ready() else v.value()) if type(v) in pending else v for v in rec)


def settle(rec: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """`resolve(rec)` if every Pending in it is ready, else None (one look at the fields)."""
    pending = _pending_types(rec)
    if not pending:
        return rec
    out = list(rec)
    for i, v in enumerate(rec):
        if type(v) in pending:
            if not v.ready():
                return None
            out[i] = v.value()
    return tuple(out)
