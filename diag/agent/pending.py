"""Values a hook cannot know yet: a GPU duration measured by CUDA events that have not completed.

A hook puts a `Pending` into its record instead of a number; the writer thread holds such a record
back until `ready()` (never synchronizing the device), then writes `value()`. After `MAX_HOLD_S` a
still-pending value is written as null and counted, so a stuck stream cannot grow memory forever.
A held collective still not completed after `OPEN_S` is also written at once as a `comm_open` record
(`Entered`): a hang or a desync is then on disk ~1.5 s after the call, not 10 s (the desync cell of
the fault matrix was named 15.7-16.7 s after the fault, nearly all of it this hold).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from diag import schema

MAX_HOLD_S = 10.0
OPEN_S = 1.5  # a collective held this long is announced as entered, not completed (a healthy call
# on CPU/gloo takes milliseconds; one waiting for a straggler or a slow link, well under a second)


class Pending(ABC):
    """Base class: subclasses answer `ready()` cheaply and `value()` once ready."""

    __slots__ = ()

    @abstractmethod
    def ready(self) -> bool:
        """True once the value can be read without waiting (e.g. `event.query()`)."""

    @abstractmethod
    def value(self) -> Any:
        """The resolved value; only called after `ready()` returned True."""

    def poll(self) -> Any:
        """`value()` if ready, else `NOT_READY`: the writer's one look at a record's declared spot
        (a subclass answers in one call, not two)."""
        return self.value() if self.ready() else NOT_READY


NOT_READY: Any = object()  # what `Pending.poll` answers for a value not known yet


_PENDING: set[type] = set()  # types seen so far, sorted once (an ABC isinstance costs ~1 us a field)
_PLAIN: set[type] = set()
PENDING_TYPES, PLAIN_TYPES = _PENDING, _PLAIN  # the same sets, for the writer's inline `poll_spot`


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


_SPOTS: dict[tuple[str, int], int] = {}  # (kind, record length) -> where its only Pending may sit


def declare_spot(kind: str, length: int, index: int) -> None:
    """A collector's promise: its `kind` records of `length` fields carry a Pending at `index` or
    nowhere. The writer then settles them by one look at that field (about 0.3 us, not 1.3: the
    general look builds a set of every field's type; most records of a job are collectives)."""
    _SPOTS[(kind, length)] = index


def spot(kind: str, length: int) -> int | None:
    """Where `kind` records of `length` fields were declared to carry their Pending (`declare_spot`)."""
    return _SPOTS.get((kind, length))


UNSEEN: Any = object()  # what `poll_spot` answers for a type not looked at yet


def poll_spot(v: Any) -> Any:
    """What a declared spot holding `v` settles to: `v` itself (not a Pending), its value (a ready
    Pending), NOT_READY, or UNSEEN (a type not looked at yet: `settle` the record)."""
    kind = type(v)
    if kind in _PENDING:
        return v.poll()
    return v if kind in _PLAIN else UNSEEN


def settle(rec: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """`resolve(rec)` if every Pending in it is ready, else None (one look at the fields)."""
    at = _SPOTS.get((rec[0], len(rec))) if rec else None
    if at is not None:
        v = rec[at]
        value = poll_spot(v)
        if value is NOT_READY:
            return None
        if value is not UNSEEN:
            return rec if value is v else (*rec[:at], value, *rec[at + 1 :])
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


class Entered:
    """Announces each held collective once it has waited `OPEN_S`: a `comm_open` copy of its record,
    the pending duration null. Looked at on the writer's flushes only while records are held."""

    __slots__ = ("told",)

    def __init__(self) -> None:
        self.told: set[int] = set()  # id() of held records already announced (alive while held)

    def announce(self, held: list[tuple[float, tuple[Any, ...]]], now: float) -> list[tuple[Any, ...]]:
        """`comm_open` records for the held collectives newly older than `OPEN_S`."""
        out, alive = [], set()
        for since, rec in held:
            key = id(rec)
            alive.add(key)
            if key not in self.told and now - since >= OPEN_S and rec[0] == schema.COMM:
                self.told.add(key)
                out.append((schema.COMM_OPEN, *resolve(rec, give_up=True)[1:]))
        self.told &= alive
        return out
