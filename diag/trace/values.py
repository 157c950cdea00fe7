"""Which parsed values a reader accepts: JSON is wider than what analysis can compute with.

A hostile or corrupt trace line may hold NaN / Infinity (Python's json accepts them), a float
that overflows to inf (`1e999`), an integer beyond 64 bits, a negative duration, or nesting deep
enough to exhaust the stack. Each makes pandas / numpy / the TUI raise far from the input (OverflowError,
ValueError) or print nonsense ("median -9223372036854.8 ms"), so readers drop such a record at
parse time with one reason instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

INT64 = 1 << 63
# fields every reader computes with: a number or null, never a string, list or bool
NUMERIC = (
    "ts",
    "dur",
    "step",
    "bytes",
    "group_size",
    "flops",
    "mem_delta",
    "allocated",
    "reserved",
    "peak",
    "capacity",
    "rss",
    "samples",
    "tokens",
    "count",
    "lines",
)
_NUMERIC = frozenset(NUMERIC)
MAX_DEPTH = 64  # diag writes flat records (stats nest 2 deep); deeper is not a diag record


class BadValue(ValueError):
    """A value outside what readers accept; `str()` says which."""


def _no_constant(name: str) -> Any:
    raise BadValue(f"holds {name}")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)  # one decoder: loads(**kw) builds one a call

_fast_loads: Callable[[bytes | str], Any] | None
_FastError: type[Exception]
try:  # 3-5x faster per line (diag top at 1,024 ranks parses ~45,000 lines a second)
    import orjson

    _fast_loads, _FastError = orjson.loads, orjson.JSONDecodeError
except ImportError:  # pragma: no cover - orjson comes with the analyze extra
    _fast_loads, _FastError = None, ValueError


def loads(line: bytes | str, exact: bool = False) -> Any:
    """`json.loads` that refuses NaN / Infinity (BadValue) and turns a stack overflow on deep
    nesting into a BadValue as well. orjson parses first: it accepts only strict JSON, which
    the stdlib parses to the same values; whatever it refuses (NaN, bad UTF-8, invalid JSON) goes
    to the stdlib parser, whose verdict and reason stand. It reads an integer beyond 64 bits as a
    float, so a record `problem` refuses is read again with `exact` (the stdlib only) to name why."""
    if _fast_loads is not None and not exact:
        try:
            return _fast_loads(line)
        except _FastError:
            pass
    try:
        return _DECODER.decode(line.decode() if isinstance(line, bytes) else line)
    except RecursionError:
        raise BadValue("is nested too deeply") from None


def problem(obj: dict[str, Any]) -> str | None:
    """Why a parsed record is refused (a number out of range, a `NUMERIC` field that is not a
    number, a negative `dur`, too deep), or None.
    A flat record costs one pass over its values; nested ones are walked without recursion."""
    not_number = False
    for key, value in obj.items():
        kind = type(value)
        if kind is int or kind is float:
            if not -INT64 < value < INT64:  # also false for NaN
                return f"has {key} out of range ({_show(value)})"
        elif kind is dict or kind is list:
            why = _nested(key, value)
            if why is not None:
                return why
            not_number = not_number or key in _NUMERIC
        elif value is not None and key in _NUMERIC:
            not_number = True
    if not_number:  # rare: name the first in NUMERIC's order, whatever the record's
        for key in NUMERIC:
            value = obj.get(key)
            if value is not None and type(value) is not int and type(value) is not float:
                return f"has {key} that is not a number ({str(value)[:30]!r})"
    dur = obj.get("dur")
    if (type(dur) is int or type(dur) is float) and dur < 0:
        return f"has a negative dur ({dur})"
    return None


def _nested(key: str, value: Any) -> str | None:
    if type(value) is list and _ints_in_range(value):  # a group's ranks: most records' one nesting
        return None
    stack: list[tuple[str, Any, int]] = [(key, value, 1)]
    while stack:
        key, value, depth = stack.pop()
        kind = type(value)
        if kind is int or kind is float:
            if not -INT64 < value < INT64:
                return f"has {key} out of range ({_show(value)})"
        elif kind is dict or kind is list:
            if depth >= MAX_DEPTH:
                return "is nested too deeply"
            items = value.items() if kind is dict else ((key, v) for v in value)
            stack.extend((str(k), v, depth + 1) for k, v in items)
    return None


def _ints_in_range(values: list[Any]) -> bool:
    """Every item an integer (not a bool) within 64 bits, checked in C: a call's `group_ranks`
    walked an item at a time cost more than the rest of its record (1,024 items at 1,024 ranks)."""
    return set(map(type, values)) <= {int} and (not values or (-INT64 < min(values) and max(values) < INT64))


def _show(value: float) -> str:
    if isinstance(value, int) and abs(value) >= 10**12:  # (a bool is never that big)
        text = f"a {value.bit_length()}-bit integer"
    else:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
