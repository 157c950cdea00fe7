"""The writer's direct comm line is byte for byte the general path's (`dumps(to_json(rec))`), and
any record outside the agent's types goes the general way."""

from __future__ import annotations

import json

import pytest

from diag import schema
from diag.trace.comm_line import comm_line
from diag.trace.writer import dumps

W0, P0 = 1_764_000_000_000_000_000, 123_456_789


def rec(**kw):
    fields = {
        "step": 7,
        "op": "all_reduce",
        "bytes": 4096,
        "dtype": "bfloat16",
        "group": "dp:5",
        "group_size": 2,
        "group_ranks": (0, 1),
        "ts": P0 + 55_555,
        "dur": 12_345,
        "module": "module.layers.0.mlp",
        "async_op": False,
    }
    fields.update(kw)
    return (schema.COMM, *fields.values())


CASES = [
    rec(),
    rec(dur=None, module=None, async_op=None, group_ranks=None, dtype=None),
    rec(async_op=True, op="reduce_scatter", group_size=8, group_ranks=tuple(range(8))),
    rec(dur=0, bytes=0),  # zero duration: bandwidths are 0.0
    rec(op="send", module='odd "name"\\with\u00e9\n', group="tp:\u00fc"),
    rec(dur=3, bytes=10**15, step=10**12),
    rec(ts=P0 - 999),  # before the agent's clock origin
]


@pytest.mark.parametrize("r", CASES)
def test_same_line_as_the_general_path(r):
    line = comm_line(r, W0, P0)
    assert line is not None
    assert line == dumps(schema.to_json(r, W0, P0))
    assert json.loads(line)["k"] == "comm"


@pytest.mark.parametrize(
    "r",
    [
        rec(bytes=4096.0),
        rec(group_ranks=[0, 1]),
        rec(group_ranks=(0, "1")),
        rec(async_op=1),
        rec(step=True),
        rec(module=3),
        rec(dur=1.5),
        (schema.COMM, 1, "all_reduce"),
    ],
)
def test_other_types_take_the_general_path(r):
    assert comm_line(r, W0, P0) is None


def test_a_cached_call_shape_does_not_serve_equal_values_of_other_types():
    """The call's parts of the line are cached by (op, bytes, dtype, group, size, ranks, module,
    async_op): 4096.0 and True hash and compare equal to 4096 and 1, and must still take the general
    path."""
    assert comm_line(rec(), W0, P0) is not None  # the int shape is cached now
    assert comm_line(rec(bytes=4096.0), W0, P0) is None
    assert comm_line(rec(group_size=True), W0, P0) is None
    assert comm_line(rec(async_op=True), W0, P0) is not None
    assert comm_line(rec(async_op=1), W0, P0) is None
    assert comm_line(rec(module="m"), W0, P0) == dumps(schema.to_json(rec(module="m"), W0, P0))


def test_the_caches_start_over_past_their_bound(monkeypatch):
    from diag.trace import comm_line as cl

    monkeypatch.setattr(cl, "MAX_SHAPES", 4)
    for n in range(10):
        r = rec(bytes=n, module=f"m{n}")
        assert comm_line(r, W0, P0) == dumps(schema.to_json(r, W0, P0))
    assert len(cl._PLANS) <= 4
