"""A flat record's JSON line written straight from its tuple: the writer's path for every record but
collectives (`comm_line`), when each field is null, a bool, an int, a finite float or a str.

The step, memory, overflow, sched and most meta records went through a dict (`schema.to_json`) and
the JSON encoder: 2-3 of them a step plus one a flush, each ~5-8 us on the writer's cold flushes in
bench/overhead's job. Byte for byte what `dumps(to_json(rec))` writes (tests/unit/test_flat_line.py):
the same keys in the same order (a record shorter than its kind's keys stops early, a longer one is
cut, as `zip` does), `ts` moved to the wall clock, floats as `float.__repr__`, strings as the
encoder's ASCII escapes. Anything else (a dict, a tuple, a NaN, a subclass, a collective, an unknown
kind) gives None: the general path writes it as before.
"""

from __future__ import annotations

from typing import Any

from diag import schema
from diag.trace.comm_line import _FLAGS as _CONST
from diag.trace.comm_line import _float, _str  # the writer's encoder's spelling, in one place

# kind -> ('"k":', '"step":', ...) and where its `ts` and `step` sit (-1: none)
_HEADS: dict[str, tuple[tuple[str, ...], int, int]] = {}


def _heads(kind: str) -> tuple[tuple[str, ...], int, int] | None:
    keys = schema._KEYS.get(kind)
    if keys is None or kind == schema.COMM:  # a collective's line adds its bandwidths
        return None
    at = {k: i for i, k in enumerate(keys)}
    out = _HEADS[kind] = (tuple(f"{_str(k)}:" for k in keys), at.get("ts", -1), at.get("step", -1))
    return out


def flat_line(rec: tuple[Any, ...], wall0_ns: int, perf0_ns: int) -> tuple[str, Any] | None:
    """(the record's line, its step or None), or None where the general path must write it."""
    kind = rec[0]
    heads = _HEADS.get(kind) if type(kind) is str else None
    if heads is None:
        heads = _heads(kind) if type(kind) is str else None
        if heads is None:
            return None
    keys, ts_at, step_at = heads
    parts = []
    for i, (key, v) in enumerate(zip(keys, rec)):
        t = type(v)
        if t is str:
            text = _str(v)
        elif t is int:
            text = str(wall0_ns + (v - perf0_ns) if i == ts_at else v)
        elif t is float:
            if i == ts_at or v - v != 0.0:  # a float ts stays as it is in to_json; NaN, inf: refused
                return None
            text = _float(v)
        elif v is None or t is bool:
            if t is bool and i == ts_at:  # to_json moves any int `ts`, a bool too
                return None
            text = _CONST[v]
        else:
            return None
        parts.append(key + text)
    step = rec[step_at] if 0 <= step_at < len(rec) else None
    return "{" + ",".join(parts) + "}", step
