"""A `comm` record's JSON line written straight from its tuple: the writer thread's hot path.

A job issues several collectives per step and the writer turns each into a line; through
`schema.to_json` (a dict) and the JSON encoder that was most of the agent's CPU time per step on a
busy host. Here the line is one f-string over the record's fields, byte for byte what
`dumps(to_json(rec))` writes (tests/unit/test_comm_line.py compares them); a field of any other type
than the agent writes (None for a fast path it does not know) takes the general path.
"""

from __future__ import annotations

import json.encoder
from typing import Any

from diag import schema

_str = json.encoder.encode_basestring_ascii  # what the writer's encoder uses for strings
_float = float.__repr__
_ranks: dict[tuple[int, ...], str] = {}  # a group's ranks, encoded once


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


def comm_line(rec: tuple[Any, ...], wall0_ns: int, perf0_ns: int) -> str | None:
    """The line of a resolved `comm` record, or None where a field is not of the agent's types."""
    if len(rec) != 12:
        return None
    _, step, op, nbytes, dtype, group, size, ranks, ts, dur, module, async_op = rec
    if type(step) is not int or type(op) is not str or type(nbytes) is not int or type(ts) is not int:
        return None
    if type(size) is not int or type(group) is not str:
        return None
    texts = (_opt_str(dtype), _ranks_text(ranks), _opt_int(dur), _opt_str(module))
    if None in texts:
        return None
    if async_op is None:
        flag = "null"
    elif async_op is True:
        flag = "true"
    elif async_op is False:
        flag = "false"
    else:
        return None
    alg, bus = schema.bandwidths(op, nbytes, dur or 0, size)
    if not (type(alg) is float and type(bus) is float and alg - alg == 0.0 and bus - bus == 0.0):
        return None  # an int (zero duration) or a non-finite float: as the general path writes it
    d, r, u, m = texts
    return (
        f'{{"k":"comm","step":{step},"op":{_str(op)},"bytes":{nbytes},"dtype":{d},'
        f'"group":{_str(group)},"group_size":{size},"group_ranks":{r},'
        f'"ts":{wall0_ns + (ts - perf0_ns)},"dur":{u},"module":{m},"async_op":{flag},'
        f'"algbw":{_float(alg)},"busbw":{_float(bus)}}}'
    )
