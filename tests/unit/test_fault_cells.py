"""How a fault-matrix cell is judged (tests/integration/faults.py), on made-up findings: the expected
rule naming the right rank, nothing else, and for a hang the live verdict naming the stopped rank."""

from __future__ import annotations

from diag.findings import Finding
from tests.integration.faults import Cell, Outcome, render


def finding(rule: str, ranks: list[int], severity: str = "warning") -> Finding:
    return Finding(rule=rule, severity=severity, title=rule, detail="", ranks=ranks)


STRAGGLER = Cell("DDP", "straggler", "m", (), expect="straggler", rank=1)
HANG = Cell("TP", "hang", "m", (), expect="hang_desync", rank=1, inject="stop")
HEALTHY = Cell("DDP", "healthy", "m", ())


def test_the_expected_rule_must_name_the_planted_rank():
    assert Outcome(STRAGGLER, [finding("straggler", [1])]).correct()
    assert not Outcome(STRAGGLER, [finding("straggler", [0])]).correct()  # the wrong rank
    assert not Outcome(STRAGGLER, []).correct()


def test_any_other_alarm_is_false_and_a_control_must_get_none():
    out = Outcome(STRAGGLER, [finding("straggler", [1]), finding("idle_between_steps", [0, 1])])
    assert out.false_alarms() == ["idle_between_steps (warning, ranks [0, 1])"] and not out.correct()
    assert Outcome(HEALTHY, []).correct()
    assert not Outcome(HEALTHY, [finding("straggler", [0])]).correct()


def _line(rule: str, ranks: list[int], at_s: float) -> dict:
    return {"event": "new", "rule": rule, "severity": "critical", "ranks": ranks, "at_s": at_s, "title": rule}


def test_a_hang_is_judged_by_the_live_verdict():
    good = _line("hang_desync", [1], 4.0)
    assert Outcome(HANG, [], live=[good]).correct()  # post-mortem not required
    assert not Outcome(HANG, [], live=[]).correct()
    assert not Outcome(HANG, [], live=[_line("hang_desync", [0], 4.0)]).correct()  # the wrong rank
    assert not Outcome(HANG, [], live=[_line("hang_desync", [1], 12.0)]).correct()  # past 10 s
    wrong = Outcome(HANG, [], live=[good, _line("straggler", [0], 1.0)])
    assert wrong.false_alarms() == ["live straggler (critical, ranks [0])"] and not wrong.correct()
    assert "no verdict in 30 s" in render([Outcome(HANG, [], live=[]).row()])
    assert "hang_desync (4.0 s after the fault)" in render([Outcome(HANG, [], live=[good]).row()])


def test_throttle_stops_a_process_part_of_the_time_and_leaves_it_running():
    """The throttled-rank cell's duty cycle (40 ms stopped in every 100 ms), on a real busy process:
    seen stopped (T) and running between the stops, and running on after stop() (never left stopped)."""
    import subprocess
    import sys
    import time

    from diag.inject.checks import status_fields
    from diag.live.looks import QUIET  # running, sleeping or in a disk wait
    from tests.integration.faults import Throttle

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        throttle = Throttle(busy.pid)
        states = set()
        for _ in range(40):
            states.add((status_fields(busy.pid) or {}).get("State", "?")[:1])
            time.sleep(0.013)
        throttle.stop()
        assert "T" in states and states & set(QUIET)
        time.sleep(0.05)
        assert (status_fields(busy.pid) or {}).get("State", "?")[:1] in QUIET
    finally:
        busy.kill()
        busy.wait()
