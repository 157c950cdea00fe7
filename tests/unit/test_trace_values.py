"""Trace lines parse with orjson first (diag top at 1,024 ranks reads ~45,000 lines a second), and
what a line is refused for is still the stdlib's reading: orjson takes an integer beyond 64 bits as
a float, which would otherwise be reported as a float out of range."""

from __future__ import annotations

import json

import pytest

from diag.trace import values
from diag.trace.reader import parse_line


def test_records_read_alike_by_both_parsers() -> None:
    line = json.dumps(
        {"k": "comm", "ts": 1790857026000000123, "dur": 1.5, "op": "all_reduce", "name": "é", "s": {"a": [1]}}
    ).encode()
    assert values.loads(line) == values.loads(line, exact=True) == json.loads(line)
    assert parse_line(line) == (json.loads(line), None)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"k": "comm", "ts": 123456789012345678901234567890}', "has ts out of range (a 97-bit integer)"),
        ('{"k": "comm", "bytes": 18446744073709551615}', "has bytes out of range (a 64-bit integer)"),
        ('{"k": "comm", "ts": NaN}', "holds NaN"),
        ('{"k": "comm", "dur": -3}', "has a negative dur (-3)"),
        # a group's ranks take a fast check in C; an item out of range is still named by the walk
        (
            '{"k": "comm", "group_ranks": [0, 1, 18446744073709551615]}',
            "has group_ranks out of range (a 64-bit integer)",
        ),
        ('{"k": "comm", "group_ranks": [0, 1e999]}', "has group_ranks out of range (inf)"),
        ('{"k": "comm", "group_ranks": [0, [[[[1]]]]], "dur": -1}', "has a negative dur (-1)"),
    ],
)
def test_refused_records_name_the_stdlib_reason(text: str, why: str) -> None:
    assert parse_line(text.encode()) == (None, f"a record that {why}")


@pytest.mark.parametrize("ranks", [[], [0, 1], list(range(1_024)), [0, True], [0, "1"], [0, 1.5], [0, None]])
def test_a_groups_ranks_in_range_are_accepted_as_the_walk_accepts_them(ranks: list) -> None:
    """Whatever the fast check passes, the walk item by item passes too (bools, strings, floats
    and nulls go to the walk)."""
    assert values.problem({"k": "comm", "group_ranks": ranks}) is None
