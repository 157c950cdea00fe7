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
    assert comm_line(rec(group_ranks=(0, True)), W0, P0) is None  # (== (0, 1), cached above)
    assert comm_line(rec(module="m"), W0, P0) == dumps(schema.to_json(rec(module="m"), W0, P0))


def test_the_caches_start_over_past_their_bound(monkeypatch):
    from diag.trace import comm_line as cl

    monkeypatch.setattr(cl, "MAX_SHAPES", 4)
    for n in range(10):
        r = rec(bytes=n, module=f"m{n}")
        assert comm_line(r, W0, P0) == dumps(schema.to_json(r, W0, P0))
    assert len(cl._PLANS) <= 4


@pytest.fixture(autouse=True)
def _new_file():
    """Each test writes a file of its own: a group's first call carries its ranks."""
    from diag.trace.comm_line import new_file

    new_file()


BIG = tuple(range(16))  # more than `ALWAYS` ranks: written once a step


def _read(lines, steps=None):
    """The records a reader of `lines` in file order gets (only those of `steps`: a window)."""
    from diag.trace.group_members import Fill

    fill, out = Fill(), []
    for line in lines:
        r = json.loads(line)
        if steps is None or r["step"] in steps:
            fill(r)
            out.append(r)
    return out


def test_a_large_groups_ranks_are_written_on_its_first_call_of_a_step():
    calls = [rec(step=s, group_ranks=BIG, group_size=16, ts=P0 + i) for i, s in enumerate([1, 1, 1, 2, 2])]
    lines = [comm_line(r, W0, P0) for r in calls]
    assert ['"group_ranks"' in line for line in lines] == [True, False, False, True, False]
    assert lines[1] == dumps(
        {k: v for k, v in schema.to_json(calls[1], W0, P0).items() if k != "group_ranks"}
    )
    assert _read(lines) == [json.loads(dumps(schema.to_json(r, W0, P0))) for r in calls]
    small = [comm_line(rec(step=1, ts=P0 + i), W0, P0) for i in range(3)]  # (0, 1): always
    assert all('"group_ranks":[0,1]' in line for line in small)


def test_a_reader_of_any_window_of_steps_gets_every_calls_ranks():
    """Groups of the same name with other ranks, small and large, calls out of step order (a
    pending collective written late) and calls written the general way, interleaved at random:
    every reader, of the whole file or of any set of its steps, fills each call's own ranks."""
    import random

    rng = random.Random(7)
    shapes = [
        ("dp", BIG),
        ("dp", tuple(range(16, 32))),
        ("dp", (0, 1)),
        ("tp:0", tuple(range(9))),
        ("tp:0", None),
    ]
    calls, step = [], 0
    for i in range(400):
        step += rng.random() < 0.1
        group, ranks = rng.choice(shapes)
        size = len(ranks) if ranks else 4
        s = step - (rng.random() < 0.1)  # a late one of the step before
        calls.append(rec(step=s, group=group, group_ranks=ranks, group_size=size, ts=P0 + i, bytes=i))
    lines = []
    for r in calls:
        if rng.random() < 0.05:  # not the agent's types (a float size): written the general way
            r = (*r[:3], float(r[3]), *r[4:])
        elif rng.random() < 0.02:
            assert comm_line((schema.COMM,), W0, P0) is None  # a malformed record: lost
        line = comm_line(r, W0, P0)
        lines.append(line if line is not None else dumps(schema.to_json(r, W0, P0)))
    full = [json.loads(dumps(schema.to_json(r, W0, P0))) for r in calls]
    assert sum('"group_ranks"' not in line for line in lines) > 40
    assert _read(lines) == full
    for _ in range(20):
        steps = set(rng.sample(range(step + 1), 3))
        assert _read(lines, steps) == [r for r in full if r["step"] in steps]
