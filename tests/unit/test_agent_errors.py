"""The agent's error counts are keyed by (collector, where, exception): a `where` or an exception
name holding a colon is filed as given, with its message."""

from __future__ import annotations

import diag
from diag import agent


def test_a_colon_in_where_is_kept_whole(tmp_path) -> None:
    ag = agent.start(str(tmp_path), what=("steps",))
    for _ in range(2):
        ag.record_error("agent", "format:comm", KeyError("ts"))
    ag.record_error("comms", "allreduce", ValueError("a: b"))
    agent.stop()
    tr = diag.load(str(tmp_path))
    rows = {
        (r["collector"], r["where"], r["exc"]): (r["message"], r["count"])
        for r in tr.errors.astype({"collector": str, "where": str, "exc": str}).to_dict("records")
    }
    assert rows == {
        ("agent", "format:comm", "KeyError"): ("KeyError: 'ts'", 2),
        ("comms", "allreduce", "ValueError"): ("ValueError: a: b", 1),
    }
    assert tr.stats.iloc[-1]["errors"] == {"agent": 2, "comms": 1}


def test_counts_are_keyed_by_tuple(tmp_path) -> None:
    ag = agent.start(str(tmp_path), what=("steps",))
    ag.record_error("a:b", "c", RuntimeError())
    errors = dict(ag.errors)
    status = ag.status()
    agent.stop()
    assert errors == {("a:b", "c", "RuntimeError"): 1}
    assert status["errors"] == {"a:b": 1}
