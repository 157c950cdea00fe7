"""The writer's direct line for flat records is byte for byte the general path's
(`dumps(to_json(rec))`), and a record it cannot write exactly goes the general way (None)."""

from __future__ import annotations

import json

import pytest

from diag import schema
from diag.trace.flat_line import flat_line
from diag.trace.writer import dumps

W0, P0 = 1_764_000_000_000_000_000, 123_456_789


class Str(str):
    pass


CASES = [
    (schema.STEP, 12, P0 + 1000, 65_000_000, 32, None, True),
    (schema.STEP, 0, P0, None, None, None, False),
    (schema.MEMORY, 11, P0 + 5, "cpu", None, None, None, 270_000_000_000, 1_234_567_890, None),
    (schema.MEMORY, 3, P0 - 7, "cuda:0", 1, 2, 3, 4, 5, 'module.layers.0 "mlp"\\\u00e9\n'),
    (schema.OVERFLOW, 5, P0 + 9, True, 65536.0, 32768.0, 1, "deepspeed_fp16"),
    (schema.OVERFLOW, 5, P0 + 9, False, -0.0, 1e-300, 0, "megatron"),
    (schema.SCHED, P0 + 3, 49_221_667, 10_061_208),
    (schema.META, P0, "attribute_every", 100),
    (schema.META, P0, "step_origin", "deepspeed"),
    (schema.META, P0, "device_name", "NVIDIA H100 \u00fc"),
    (schema.META, P0, "flag", None),
    (schema.STEP, 12, P0),  # shorter than its keys: stops early, as zip does
    (schema.STEP, 12, P0, 1, 2, 3, True, "extra"),  # longer: cut
    (schema.STEP, 2**70, P0, -5, 0, 0, None),  # big and negative ints
]

GENERAL = [
    (schema.META, P0, "groups", {"dp:0": {"size": 2}}),  # a dict
    (schema.META, P0, "ranks", [0, 1]),
    (schema.META, P0, "ranks", (0, 1)),
    (schema.OVERFLOW, 5, P0, True, float("nan"), 1.0, 1, "deepspeed_fp16"),  # NaN: null in the general path
    (schema.OVERFLOW, 5, P0, True, float("inf"), 1.0, 1, "deepspeed_fp16"),
    (schema.META, P0, "name", Str("sub")),  # a str subclass
    (schema.STEP, 12, True, None, None, None, True),  # a bool ts (to_json moves it as an int)
    (schema.STEP, 12, 1.5, None, None, None, True),  # a float ts
    (schema.COMM, 7, "all_reduce", 4, "float32", "dp:0", 2, (0, 1), P0, 10, None, False),  # comm_line's
    ("no-such-kind", 1, 2),
]


@pytest.mark.parametrize("rec", CASES, ids=[f"{r[0]}-{i}" for i, r in enumerate(CASES)])
def test_direct_line_is_the_general_line(rec):
    obj = schema.to_json(rec, W0, P0)
    out = flat_line(rec, W0, P0)
    assert out is not None
    line, step = out
    assert line == dumps(obj)
    assert step == obj.get("step")
    assert json.loads(line) == obj


@pytest.mark.parametrize("rec", GENERAL, ids=[f"{r[0]}-{i}" for i, r in enumerate(GENERAL)])
def test_other_records_go_the_general_way(rec):
    assert flat_line(rec, W0, P0) is None


def test_the_writer_writes_each_kind_as_the_general_path_would(tmp_path):
    """Through the agent's own flush: every record's line as `dumps(to_json(rec))`, in order."""
    from diag.agent import AgentOptions
    from diag.agent.runtime import Agent

    ag = Agent(AgentOptions(trace_dir=str(tmp_path), what=("steps",)))
    ag.start()
    try:
        recs = [*CASES, *GENERAL[:-1]]
        for rec in recs:
            ag.emit(rec)
        ag._flush(final=False)
        path = ag.status()["trace_file"]
    finally:
        ag.stop()
    with open(path) as f:
        lines = f.read().splitlines()
    want = [dumps(schema.to_json(r, ag._wall0, ag._perf0)) for r in recs]
    start = next(i for i, line in enumerate(lines) if line == want[0])
    assert lines[start : start + len(want)] == want
