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

A group's ranks are written on its first call of each step, not on every call (`group_ranks`
omitted after): at 1,024 ranks in one data-parallel group the list is ~4 KB of a ~4.2 KB line, and a
ZeRO-3 step makes hundreds of such calls. A group of `ALWAYS` ranks or fewer keeps them on every
call (a few bytes; a reader without the fill below still sees a lone call as alone). The reader
gives an omitted call the ranks of its group's last call that had them (`group_members.Fill`);
`_shown` mirrors what that reader has seen, per group name: (the step of the last line that carried
them, their text), and a call omits them only where that is its own step and ranks. So the line
that carried them is of the same step, and a reader of a window of steps (`trace.stepfile`) has
read it. A call written the general way (`schema.to_json`) forgets its group: its next call
carries them again.
"""

from __future__ import annotations

import json.encoder
from typing import Any

from diag import schema

_str = json.encoder.encode_basestring_ascii  # what the writer's encoder uses for strings
_float = float.__repr__
_FLAGS = {None: "null", True: "true", False: "false"}
# id(a group's ranks tuple) -> (that tuple, (its text, its length)): the collector hands the same
# tuple each call, and a plan's key holds the text (a str's hash is kept) where hashing the tuple
# itself cost 20 us a call at 1,024 ranks (bench/group_ranks.py)
_ranks: dict[int, tuple[tuple[int, ...], tuple[str, int]]] = {}
ALWAYS = 8  # a group of this many ranks or fewer has them on every call
_shown: dict[str, tuple[int, str]] = {}  # group -> (step, ranks' text) of its last line with them
MAX_SHAPES = 10_000  # distinct calls kept (a job whose sizes vary by step starts over past it)
# a call's line around the per-record fields: (',"op":...,"ts":', ',"module":...,"algbw":', busbw /
# algbw, whether that factor is exactly 1.0, its ranks' text where it may be omitted (a group of more
# than ALWAYS ranks; else None), the first part without them); None: a field not of the agent's
# types (general path)
Plan = tuple[str, str, float, bool, str | None, str] | None
_PLANS: dict[tuple[Any, ...], Plan] = {}
FIELDS = len(schema._KEYS[schema.COMM])  # a collective's record: its kind, then its 11 fields
DUR_AT = schema._KEYS[schema.COMM].index("dur")


def _opt_str(v: Any) -> str | None:
    if v is None:
        return "null"
    return _str(v) if type(v) is str else None


def _ranks_key(v: Any) -> tuple[str, int] | None:
    """(the text, the count) of a call's ranks, or None where they are not the agent's type."""
    if v is None:
        return _NO_RANKS
    if type(v) is not tuple:
        return None
    hit = _ranks.get(id(v))
    if hit is not None and hit[0] is v:
        return hit[1]
    if not all(type(r) is int for r in v):
        return None
    if len(_ranks) >= MAX_SHAPES:
        _ranks.clear()
    key = ("[" + ",".join(map(str, v)) + "]", len(v))
    _ranks[id(v)] = (v, key)
    return key


_NO_RANKS = ("null", 0)


def _plan(key: tuple[Any, ...]) -> Plan:
    """The call's parts of the line and busbw factor, or None where a field is not of the agent's
    types (kept: the next record of that call goes the general way at once)."""
    op, nbytes, dtype, group, size, (r, n), module, async_op = key
    d, m = _opt_str(dtype), _opt_str(module)
    ok = type(op) is str and type(nbytes) is int and type(group) is str and type(size) is int
    plan = None
    if ok and d is not None and m is not None:
        factor = schema.bus_factor(op, size)
        head = f',"op":{_str(op)},"bytes":{nbytes},"dtype":{d},"group":{_str(group)},"group_size":{size},'
        plan = (
            f'{head}"group_ranks":{r},"ts":',
            f',"module":{m},"async_op":{_FLAGS[async_op]},"algbw":',
            factor,
            factor == 1.0,
            r if n > ALWAYS else None,
            f'{head}"ts":',
        )
    if len(_PLANS) >= MAX_SHAPES:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def new_file() -> None:
    """A new trace file begins: its first call of each group carries the group's ranks."""
    _shown.clear()


def comm_line(rec: tuple[Any, ...], wall0_ns: int, perf0_ns: int) -> str | None:
    """The line of a resolved `comm` record, or None where a field is not of the agent's types."""
    if len(rec) != FIELDS:
        _shown.clear()  # (written the general way: whatever its group, its next call carries them)
        return None
    return comm_text(rec, rec[DUR_AT], wall0_ns - perf0_ns)


def comm_text(rec: tuple[Any, ...], dur: Any, shift: int) -> str | None:
    """`comm_line` of a `comm` record of `FIELDS` fields with `dur` for its duration field (the writer passes
    the settled value of a pending one, so the record is not rebuilt); `shift` = wall0 - perf0. The
    caller writes what it returns, in this order (None: the general way, which forgets the group)."""
    _, step, op, nbytes, dtype, group, size, ranks, ts, _, module, async_op = rec
    # equal keys of other types (4096.0 for 4096, 1 for True, a str subclass) must not share a plan
    if type(step) is not int or type(ts) is not int or type(nbytes) is not int or type(size) is not int:
        return _general(group)
    if type(op) is not str or (async_op is not None and async_op is not True and async_op is not False):
        return _general(group)
    ranks_key = _ranks_key(ranks)
    if ranks_key is None:
        return _general(group)
    key = (op, nbytes, dtype, group, size, ranks_key, module, async_op)
    try:
        plan = _PLANS[key]
    except KeyError:
        plan = _plan(key)
    except TypeError:  # an unhashable field
        return _general(group)
    if plan is None:
        return _general(group)
    d: Any = dur
    if dur is None:
        d, a, b = "null", "0.0", "0.0"
    elif type(dur) is not int:
        return _general(group)
    else:
        alg = nbytes / dur if dur > 0 else 0.0
        if plan[3]:
            a = b = _float(alg)  # alg * 1.0 is alg, bit for bit
        else:
            bus = alg * plan[2]
            if bus - bus != 0.0:
                return _general(group)  # a non-finite float: as the general path writes it
            a, b = _float(alg), _float(bus)
    first = plan[0]
    if plan[4] is not None:  # a large group: its ranks once a step (`_shown`)
        shown = _shown.get(group)
        if shown is not None and shown[0] == step and shown[1] == plan[4]:
            first = plan[5]
        else:
            _shown[group] = (step, plan[4])
    else:
        _shown[group] = (step, "")  # (a small group's ranks, on every call: never matched)
    return f'{{"k":"comm","step":{step}{first}{ts + shift},"dur":{d}{plan[1]}{a},"busbw":{b}}}'


def _general(group: Any) -> str | None:
    """None: a call written the general way; its group's next call carries the ranks (`_shown`)."""
    try:
        _shown.pop(group, None)
    except TypeError:  # an unhashable name
        _shown.clear()
    return None
