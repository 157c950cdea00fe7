"""A bounded buffer between the hooks (producers) and the writer thread (the consumer).

`deque.append` and `deque.popleft` are atomic under the GIL, so the hot path takes no lock. When the
writer falls behind, new records are dropped and counted per kind: memory stays bounded by
`capacity` records and nothing is lost silently.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class Ring:
    """Bounded FIFO of event tuples with per-kind drop counts."""

    __slots__ = ("_q", "capacity", "dropped", "high_water", "queue")

    def __init__(self, capacity: int) -> None:
        self._q: deque[tuple[Any, ...]] = deque()
        self.queue = self._q  # read only: the writer's "anything to write?" without a call
        self.capacity = capacity
        self.dropped: dict[str, int] = {}
        self.high_water = 0

    def push(self, rec: tuple[Any, ...]) -> None:
        """Hot path: append or count a drop. Never blocks, never raises for a full ring."""
        q = self._q
        if len(q) < self.capacity:
            q.append(rec)
        else:
            kind = rec[0]
            self.dropped[kind] = self.dropped.get(kind, 0) + 1

    def drain(self) -> list[tuple[Any, ...]]:
        """Writer side: take every record in order (one comprehension: the writer's flushes run
        cold, a call per record costs there)."""
        q = self._q
        n = len(q)
        if n > self.high_water:
            self.high_water = n
        pop = q.popleft
        return [pop() for _ in range(n)]

    def __len__(self) -> int:
        return len(self._q)
