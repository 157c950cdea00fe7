"""Fault injection for the no-harm tests: make a collector's hooks raise or stall on purpose.

Set with `start(faults={"comms": "raise"})` or `DIAG_FAULTS="layers=raise,comms=sleep:0.002"`.
Checked only when non-empty, so it costs one truth test in production.
"""

from __future__ import annotations

import os
import time


class InjectedFault(RuntimeError):
    """Raised inside a hook by request; the guard must swallow and count it."""


def parse_faults(spec: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (spec or "").split(","):
        if "=" in part:
            name, action = part.split("=", 1)
            out[name.strip()] = action.strip()
    return out


def from_env() -> dict[str, str]:
    return parse_faults(os.environ.get("DIAG_FAULTS"))


def trigger(action: str) -> None:
    """Carry out one fault action: `raise`, or `sleep:SECONDS`."""
    if action == "raise":
        raise InjectedFault("fault injected by DIAG_FAULTS")
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
