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


_KINDS: dict[type, bool] = {}  # type -> is it a Pending (an ABC isinstance costs ~1 us a field)


def _is_pending(value: Any) -> bool:
    kind = type(value)
    known = _KINDS.get(kind)
    if known is None:
        known = _KINDS[kind] = issubclass(kind, Pending)
    return known


def unresolved(rec: tuple[Any, ...]) -> bool:
    """True when some field of the record is a Pending that is not ready yet."""
    return any(_is_pending(v) and not v.ready() for v in rec)


def resolve(rec: tuple[Any, ...], give_up: bool = False) -> tuple[Any, ...]:
    """The record with every Pending replaced by its value (or None when giving up)."""
    if not any(map(_is_pending, rec)):
        return rec
    return tuple((None if give_up and not v.ready() else v.value()) if _is_pending(v) else v for v in rec)
