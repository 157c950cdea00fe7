"""Everything a collector changes in the job, recorded so that `stop()` can put it back.

Collectors never assign `obj.attr = wrapper` or keep hook handles themselves: they go through an
`Undo`, which restores originals in reverse order and lets tests check nothing was left behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MISSING = object()


class Undo:
    """A stack of undo actions: patched attributes and removable hook handles."""

    def __init__(self) -> None:
        self._actions: list[tuple[str, Callable[[], None]]] = []

    def patch(self, obj: Any, name: str, new: Any) -> Any:
        """Replace `obj.name` with `new`; return the original (which the wrapper should call)."""
        old = obj.__dict__.get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING
        original = getattr(obj, name)
        setattr(obj, name, new)

        def restore() -> None:
            if old is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    setattr(obj, name, original)
                if getattr(obj, name, _MISSING) != original:  # bound methods compare with ==
                    setattr(obj, name, original)
            else:
                setattr(obj, name, old)

        self._actions.append((f"{getattr(obj, '__name__', type(obj).__name__)}.{name}", restore))
        return original

    def hook(self, handle: Any, label: str = "hook") -> Any:
        """Keep a torch `RemovableHandle` (or anything with `.remove()`) to remove on undo."""
        self._actions.append((label, handle.remove))
        return handle

    def call(self, fn: Callable[[], None], label: str) -> None:
        """Any other undo action (restore a setting, unregister a callback)."""
        self._actions.append((label, fn))

    def labels(self) -> list[str]:
        return [label for label, _ in self._actions]

    def run(self) -> list[str]:
        """Undo everything, last first. Returns labels whose undo failed (they are still attempted)."""
        failed = []
        while self._actions:
            label, fn = self._actions.pop()
            try:
                fn()
            except Exception:  # noqa: BLE001 - undo must go on for the rest
                failed.append(label)
        return failed
