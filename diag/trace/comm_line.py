"""A `comm` record's JSON line written straight from its tuple: the writer thread's hot path.

A job issues several collectives per step and the writer turns each into a line; through
`schema.to_json` (a dict) and the JSON encoder that was most of the agent's CPU time per step on a
busy host. Here the line is one f-string over the record's fields, byte for byte what
`dumps(to_json(rec))` writes (tests/unit/test_comm_line.py compares them); a field of any other type
than the agent writes (None for a fast path it does not know) takes the general path.

A job issues the same collectives step after step, so the part of the line that names the call
(op, bytes, dtype, group, its size and ranks) and the op's busbw factor are made once per distinct
call (`_SHAPES`) and only the step, time, duration, module and bandwidths per record: 2.1 -> 1.3 us
a record (warm: a loop over 45 records of 3 ops and 5 modules).
"""

from __future__ import annotations

import json.encoder
from typing import Any

from diag import schema

_str = json.encoder.encode_basestring_ascii  # what the writer's encoder uses for strings
_float = float.__repr__
_ranks: dict[tuple[int, ...], str] = {}  # a group's ranks, encoded once
MAX_SHAPES = 10_000  # distinct calls kept (a job whose sizes vary by step starts over past it)
Shape = tuple[str, float] | None  # (the call's part of the line, busbw / algbw), None: general path
_SHAPES: dict[tuple[Any, ...], Shape] = {}
_MODULES: dict[str, str] = {}  # module names, encoded once
_FLAGS = {None: "null", True: "true", False: "false"}


def _opt_str(v: Any) -> str | None:
    if v is None:
        return "null"
    return _str(v) if type(v) is str else None


def _opt_int(v: Any) -> str | None:
    if v is None:
        return "null"
    return str(v) if type(v) is int else None


def _ranks_text(v: Any) -> str | None:
    if v is None:
        return "null"
    if type(v) is not tuple:
        return None
    text = _ranks.get(v)
    if text is None:
        if not all(type(r) is int for r in v) or len(_ranks) > 10_000:
            return None
        text = _ranks[v] = "[" + ",".join(map(str, v)) + "]"
    return text


def _shape(key: tuple[Any, ...]) -> Shape:
    """The call's part of the line and busbw factor, or None where a field is not of the agent's
    types (kept: the next record of that call goes the general way at once)."""
    op, nbytes, dtype, group, size, ranks = key
    d, r = _opt_str(dtype), _ranks_text(ranks)
    ok = type(op) is str and type(nbytes) is int and type(group) is str and type(size) is int
    shape = None
    if ok and d is not None and r is not None:
        text = (
            f'"op":{_str(op)},"bytes":{nbytes},"dtype":{d},'
            f'"group":{_str(group)},"group_size":{size},"group_ranks":{r}'
        )
        shape = (text, schema.bus_factor(op, size))
    if len(_SHAPES) >= MAX_SHAPES:
        _SHAPES.clear()
    _SHAPES[key] = shape
    return shape


def comm_line(rec: tuple[Any, ...], wall0_ns: int, perf0_ns: int) -> str | None:
    """The line of a resolved `comm` record, or None where a field is not of the agent's types."""
    if len(rec) != 12:
        return None
    _, step, op, nbytes, dtype, group, size, ranks, ts, dur, module, async_op = rec
    # equal keys of other types (4096.0 for 4096, a str subclass) must not share a shape
    if type(step) is not int or type(ts) is not int or type(nbytes) is not int or type(size) is not int:
        return None
    key = (op, nbytes, dtype, group, size, ranks)
    try:
        shape = _SHAPES[key]
    except KeyError:
        shape = _shape(key)
    except TypeError:  # an unhashable field (a list of ranks)
        return None
    if shape is None or type(op) is not str:
        return None
    if dur is None:
        u, alg = "null", 0.0
    elif type(dur) is int:
        u, alg = str(dur), (nbytes / dur if dur > 0 else 0.0)
    else:
        return None
    m: str | None = "null" if module is None else _MODULES.get(module)
    if m is None:
        if type(module) is not str:
            return None
        if len(_MODULES) >= MAX_SHAPES:
            _MODULES.clear()
        m = _MODULES[module] = _str(module)
    if async_op is not None and async_op is not True and async_op is not False:
        return None
    bus = alg * shape[1]
    if not (alg - alg == 0.0 and bus - bus == 0.0):
        return None  # a non-finite float: as the general path writes it
    return (
        f'{{"k":"comm","step":{step},{shape[0]},"ts":{wall0_ns + (ts - perf0_ns)},"dur":{u},'
        f'"module":{m},"async_op":{_FLAGS[async_op]},"algbw":{_float(alg)},"busbw":{_float(bus)}}}'
    )
