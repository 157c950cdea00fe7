"""A rank throttled from outside (issue 17's throttled-rank cells: SIGSTOP 40 ms of every 100 ms).
Its stops land on some steps and not others, so its own work is not steadily slower, and a healthy
rank slowed by a loaded host looks the same or worse in the trace (the peer waits for it at most
steps). What tells them apart is the watcher's looks at the process: stopped and resumed again and
again (`Deaths.duty`), with its peers waiting for it over the steps meanwhile."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from diag.cli.rank_deaths import Deaths, process_facts
from tests.unit.synth_trace import MS, T0, Job, fired

STEPS, STEP_MS = 12, 80.0


def _job(stalls: dict[int, float], every_step_late: int | None = None) -> Job:
    """2 ranks, 12 steps of 80 ms, one blocking all-reduce (2 ms of transfer) at 20 ms. `stalls`:
    step -> ms rank 1 was stopped before it (rank 0 waits that long in the all-reduce).
    `every_step_late`: that rank arrives 10 ms late on every step (a rank a loaded host slows)."""
    job = Job(steps=STEPS, step_ms=STEP_MS)
    for s in range(STEPS):
        late = {r: 0.0 for r in range(2)}
        late[1] += stalls.get(s, 0.0)
        if every_step_late is not None:
            late[every_step_late] += 10.0
        arrive = max(late.values())
        for r in range(2):
            job.comm(r, s, at_ms=5 + late[r], dur_ms=2 + arrive - late[r])
    return job


def _with_fact(trace, rank: int, **fact) -> object:
    """The process fact `diag watch` puts in a header (`Deaths.facts`), as of the last step's end."""
    end = T0 + int(STEPS * (STEP_MS + 1) * MS)
    trace.headers[rank]["process"] = {"pid": 1, "state": "S", "checked_ns": end, **fact}
    return trace


DUTY = {"stopped_share": 0.4, "resumes": 40, "looked_s": 5.0}


def test_a_throttled_rank_its_peers_wait_for_is_named_and_priced(tmp_path):
    # stopped 40 ms on every third step: rank 1 is not slower on most steps, its median own work is
    # the peer's (the ratio rule is silent without the watcher's looks)
    stalls = {s: 40.0 for s in range(0, STEPS, 3)}
    trace = _job(stalls).write(str(tmp_path))
    assert fired(trace, "straggler") == []
    (f,) = fired(_with_fact(trace, 1, **DUTY), "straggler")
    assert f.ranks == [1] and "stopped from outside 40% of the time" in f.title
    assert f.evidence["caused_share"] == pytest.approx(1.0)
    # the what-if: 40 ms lost on each stalled steady step (3, 6, 9; step 0 is warm-up)
    assert f.evidence["time_lost_s"] == pytest.approx(3 * 0.040, abs=1e-6)
    assert f.evidence["affected_steps"] == [3, 6, 9]


def test_stops_nobody_waits_for_or_a_hang_are_not_a_throttled_straggler(tmp_path):
    # rank 1 seen stopped and resumed, but rank 0 is the late one on every step (a loaded host):
    # rank 1's stops cost nothing; and a rank stopped for good is hang_desync's
    trace = _job({}, every_step_late=0).write(str(tmp_path / "a"))
    assert all(1 not in f.ranks for f in fired(_with_fact(trace, 1, **DUTY), "straggler"))
    stalls = {s: 40.0 for s in range(0, STEPS, 3)}
    hang = {"stopped_share": 1.0, "resumes": 0, "looked_s": 5.0}
    assert fired(_with_fact(_job(stalls).write(str(tmp_path / "b")), 1, **hang), "straggler") == []
    # a rank slowed on every step by the host, without a stop seen: no throttle premise
    trace = _job({}, every_step_late=1).write(str(tmp_path / "c"))
    assert all("stopped from outside" not in f.title for f in fired(trace, "straggler"))


def _look(deaths: Deaths, pid: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        deaths.look(process_facts({0: {"pid": pid, "host": "h"}}, "h", time.time_ns()))
        time.sleep(0.02)


def test_duty_counts_a_real_process_stopped_and_resumed():
    """A real process, SIGSTOPped 40 ms of every 100 ms from a thread, looked at every 20 ms: seen
    stopped at a share of the looks and resumed many times; a running one never."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.04)
            proc.send_signal(signal.SIGCONT)
            done.wait(0.06)

    try:
        calm = Deaths()
        _look(calm, proc.pid, 0.5)
        assert calm.duty(0)["stopped_share"] == 0 and calm.duty(0)["resumes"] == 0
        t = threading.Thread(target=cycle, daemon=True)
        t.start()
        deaths = Deaths()
        _look(deaths, proc.pid, 2.0)
        done.set()
        t.join()
        d = deaths.duty(0)
        # 20 cycles in 2 s; looks delayed by load still see several (the rule asks >= 10%, >= 3)
        assert 0.1 <= d["stopped_share"] <= 0.8 and d["resumes"] >= 3, d
        assert 1.5 <= d["looked_s"] <= 5.0
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
