"""A `comm` record's JSON line written straight from its tuple: the writer thread's hot path.

A job issues several collectives per step and the writer turns each into a line; through
`schema.to_json` (a dict) and the JSON encoder that was most of the agent's CPU time per step on a
busy host. Here the line is one f-string over the record's fields, byte for byte what
`dumps(to_json(rec))` writes (tests/unit/test_comm_line.py compares them); a field of any other type
than the agent writes (None for a fast path it does not know) takes the general path.

A job issues the same collectives step after step, from the same few modules, so everything in the
line but the step, time, duration and bandwidths (op, bytes, dtype, group, its size and ranks,
module, async flag) and the op's busbw factor are made once per distinct call (`_PLANS`). The two
bandwidths are `float.__repr__` each (~0.45 us, the costliest part left); where the factor is 1.0 (an
all-reduce in a group of 2, broadcast, p2p) busbw is algbw, so its text is reused.
"""

from __future__ import annotations

import json.encoder
from typing import Any

from diag import schema

_str = json.encoder.encode_basestring_ascii  # what the writer's encoder uses for strings
_float = float.__repr__
_FLAGS = {None: "null", True: "true", False: "false"}
_ranks: dict[tuple[int, ...], str] = {}  # a group's ranks, encoded once
MAX_SHAPES = 10_000  # distinct calls kept (a job whose sizes vary by step starts over past it)
# a call's line around the per-record fields: (',"op":...,"ts":', ',"module":...,"algbw":', busbw /
# algbw, whether that factor is exactly 1.0); None: a field not of the agent's types (general path)
Plan = tuple[str, str, float, bool] | None
_PLANS: dict[tuple[Any, ...], Plan] = {}
FIELDS = len(schema._KEYS[schema.COMM])  # a collective's record: its kind, then its 11 fields
DUR_AT = schema._KEYS[schema.COMM].index("dur")


def _opt_str(v: Any) -> str | None:
    if v is None:
        return "null"
    return _str(v) if type(v) is str else None


def _ranks_text(v: Any) -> str | None:
    if v is None:
        return "null"
    if type(v) is not tuple:
        return None
    text = _ranks.get(v)
    if text is None:
        if not all(type(r) is int for r in v) or len(_ranks) > MAX_SHAPES:
            return None
        text = _ranks[v] = "[" + ",".join(map(str, v)) + "]"
    return text


def _plan(key: tuple[Any, ...]) -> Plan:
    """The call's parts of the line and busbw factor, or None where a field is not of the agent's
    types (kept: the next record of that call goes the general way at once)."""
    op, nbytes, dtype, group, size, ranks, module, async_op = key
    d, r, m = _opt_str(dtype), _ranks_text(ranks), _opt_str(module)
    ok = type(op) is str and type(nbytes) is int and type(group) is str and type(size) is int
    plan = None
    if ok and d is not None and r is not None and m is not None:
        factor = schema.bus_factor(op, size)
        plan = (
            f',"op":{_str(op)},"bytes":{nbytes},"dtype":{d},'
            f'"group":{_str(group)},"group_size":{size},"group_ranks":{r},"ts":',
            f',"module":{m},"async_op":{_FLAGS[async_op]},"algbw":',
            factor,
            factor == 1.0,
        )
    if len(_PLANS) >= MAX_SHAPES:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def comm_line(rec: tuple[Any, ...], wall0_ns: int, perf0_ns: int) -> str | None:
    """The line of a resolved `comm` record, or None where a field is not of the agent's types."""
    if len(rec) != FIELDS:
        return None
    return comm_text(rec, rec[DUR_AT], wall0_ns - perf0_ns)


def comm_text(rec: tuple[Any, ...], dur: Any, shift: int) -> str | None:
    """`comm_line` of a `comm` record of `FIELDS` fields with `dur` for its duration field (the writer passes
    the settled value of a pending one, so the record is not rebuilt); `shift` = wall0 - perf0."""
    _, step, op, nbytes, dtype, group, size, ranks, ts, _, module, async_op = rec
    # equal keys of other types (4096.0 for 4096, 1 for True, a str subclass) must not share a plan
    if type(step) is not int or type(ts) is not int or type(nbytes) is not int or type(size) is not int:
        return None
    if type(op) is not str or (async_op is not None and async_op is not True and async_op is not False):
        return None
    key = (op, nbytes, dtype, group, size, ranks, module, async_op)
    try:
        plan = _PLANS[key]
    except KeyError:
        plan = _plan(key)
    except TypeError:  # an unhashable field (a list of ranks)
        return None
    if plan is None:
        return None
    if dur is None:
        return f'{{"k":"comm","step":{step}{plan[0]}{ts + shift},"dur":null{plan[1]}0.0,"busbw":0.0}}'
    if type(dur) is not int:
        return None
    alg = nbytes / dur if dur > 0 else 0.0
    if plan[3]:
        a = b = _float(alg)  # alg * 1.0 is alg, bit for bit
    else:
        bus = alg * plan[2]
        if bus - bus != 0.0:
            return None  # a non-finite float: as the general path writes it
        a, b = _float(alg), _float(bus)
    return f'{{"k":"comm","step":{step}{plan[0]}{ts + shift},"dur":{dur}{plan[1]}{a},"busbw":{b}}}'
