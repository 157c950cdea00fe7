"""The one exception every injection strategy raises, in a module of its own: the strategies import
it, and `diag.inject` (which picks the strategies) imports them, so it cannot live there."""

from __future__ import annotations


class InjectFailed(Exception):
    """One strategy could not run the code in the target (the message says why, one line)."""
