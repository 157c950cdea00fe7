"""The writer thread's wake-up: an Event for one waiter, on a bare lock.

The writer wakes every flush interval (twice a second) whether or not a hook wrote anything, so
its idle wake is most of its CPU time on a job with long steps: `threading.Event.wait` runs about ten
Python frames of `threading.Condition` per wake, `Lock.acquire(timeout=...)` none.
"""

from __future__ import annotations

import threading


class Wakeup:
    """`set()` from any thread wakes the one `wait()`er (or its next wait); waiting consumes it."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # held: not set

    def wait(self, timeout: float) -> bool:
        """Until set or `timeout` s passed; True if it was set (and is now clear again)."""
        return self._lock.acquire(timeout=timeout)

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # already set, not yet consumed
            pass
