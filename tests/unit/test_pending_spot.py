"""The writer settles a collective's record by one look at its duration field (the comms
collector's declared spot), with the same result as the general look at every field."""

from __future__ import annotations

import pytest
from diag.collectors import comms
from diag.collectors.comms.timing import Later

from diag import schema
from diag.agent import pending


def _record(dur: object) -> tuple[object, ...]:
    rec = (schema.COMM, 5, "all_reduce", 4096, "float32", "world:0", 2, (0, 1), 123, dur, "blocks.0", False)
    assert len(rec) == comms.RECORD_LEN and rec[comms.DUR_AT] is dur
    return rec


def _later(dur: int | None) -> Later:
    later = Later(None, None)  # type: ignore[arg-type]  # no timer: its duration is set directly
    later.dur = dur
    return later


@pytest.mark.parametrize("dur", [_later(1500), _later(None), 1500, None])
def test_the_spot_settles_as_the_general_look(monkeypatch, dur):
    rec = _record(dur)
    general = pending.settle(rec)  # no spot declared yet for this test's view
    monkeypatch.setitem(pending._SPOTS, (schema.COMM, comms.RECORD_LEN), comms.DUR_AT)
    assert pending.settle(rec) == general
    if isinstance(dur, Later):
        assert general is None if dur.dur is None else general[comms.DUR_AT] == 1500
