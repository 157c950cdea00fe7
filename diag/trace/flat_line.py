"""A flat record's JSON line written straight from its tuple: the writer's path for every record but
collectives (`comm_line`), when each field is null, a bool, an int, a finite float or a str.

The step, memory, overflow, sched and most meta records went through a dict (`schema.to_json`) and
the JSON encoder: 2-3 of them a step plus one a flush, each ~5-8 us on the writer's cold flushes in
bench/overhead's job. Byte for byte what `dumps(to_json(rec))` writes (tests/unit/test_flat_line.py):
the same keys in the same order (a record shorter than its kind's keys stops early, a longer one is
cut, as `zip` does), `ts` moved to the wall clock, floats as `float.__repr__`, strings as the
encoder's ASCII escapes. Anything else (a dict, a tuple, a NaN, a subclass, a collective, an unknown
kind) gives None: the general path writes it as before.

A kind's records come with the same field types record after record (a step's duration is an int,
its tokens None), so the line is made by one function per (kind, field types), compiled the first
time that shape is seen: one `%` over the fields, with the keys, the kind, nulls and the `ts` shift
in its template (~0.5 us a record, not ~1.8 through a loop over the fields that asks each its type).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diag import schema
from diag.trace.comm_line import _float, _str  # the writer's encoder's spelling, in one place

MAX_SHAPES = 10_000  # distinct (kind, field types) kept; past it the cache starts over
# (kind, field types) -> the record's line given (rec, wall0 - perf0), None for the general path
Writes = Callable[[tuple[Any, ...], int], "str | None"]
_PLANS: dict[tuple[Any, ...], Writes | None] = {}
_NONE = type(None)


def _compile(kind: str, types: tuple[type, ...]) -> Writes | None:
    """The line function of records of `kind` whose fields have `types`, or None where the general
    path must write them (an unknown kind, a collective, a field of another type, a non-int ts)."""
    keys = schema._KEYS.get(kind)
    if keys is None or kind == schema.COMM or types[0] is not str:  # a collective adds its bandwidths
        return None
    template: list[str] = []
    args: list[str] = []
    checks: list[str] = []
    for i, (key, t) in enumerate(zip(keys, types)):
        head = f"{_str(key)}:".replace("%", "%%")
        if i == 0:
            template.append(head + _str(kind).replace("%", "%%"))
        elif t is _NONE:
            template.append(head + "null")
        elif key == "ts" and (t is bool or t is float):
            return None  # to_json moves a bool ts as an int, a float one not: the general path
        elif t is int:
            template.append(head + "%d")
            args.append(f"r[{i}] + shift" if key == "ts" else f"r[{i}]")
        elif t is str:
            template.append(head + "%s")
            args.append(f"_str(r[{i}])")
        elif t is float:
            template.append(head + "%s")
            args.append(f"_float(r[{i}])")
            checks.append(f"r[{i}] - r[{i}] != 0.0")  # NaN, inf: the general path writes null
        elif t is bool:
            template.append(head + "%s")
            args.append(f'("true" if r[{i}] else "false")')
        else:
            return None
    text = "{" + ",".join(template) + "}"
    check = f"    if {' or '.join(checks)}:\n        return None\n" if checks else ""
    source = f"def line(r, shift):\n{check}    return {text!r} % ({''.join(a + ', ' for a in args)})\n"
    scope: dict[str, Any] = {"_str": _str, "_float": _float}
    exec(compile(source, f"<flat_line {kind}>", "exec"), scope)  # made from schema keys only
    made: Writes = scope["line"]
    return made


def flat_text(rec: tuple[Any, ...], shift: int) -> str | None:
    """The record's line (`shift` = wall0 - perf0), or None where the general path must write it."""
    kind = rec[0]
    if type(kind) is not str:
        return None
    types = tuple(map(type, rec))
    key = (kind, types)
    try:
        writes = _PLANS[key]
    except KeyError:
        if len(_PLANS) >= MAX_SHAPES:
            _PLANS.clear()
        writes = _PLANS[key] = _compile(kind, types)
    return None if writes is None else writes(rec, shift)


def flat_line(rec: tuple[Any, ...], wall0_ns: int, perf0_ns: int) -> tuple[str, Any] | None:
    """(the record's line, its step or None), or None where the general path must write it."""
    line = flat_text(rec, wall0_ns - perf0_ns)
    if line is None:
        return None
    keys = schema._KEYS[rec[0]]
    at = keys.index("step") if "step" in keys else -1
    return line, rec[at] if 0 <= at < len(rec) else None
