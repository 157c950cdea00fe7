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
from collections.abc import Callable

import pytest
from diag.analyzers.straggler import RESUMES, STOPPED_SHARE

import diag
from diag.live.looks import named_throttled
from diag.live.proc_log import ProcLog
from diag.live.rank_deaths import LOOK_S, Deaths, process_facts
from diag.metrics.throttle import WINDOW_S, throttled_spans
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


def _kept(log: ProcLog, path: object) -> object:
    """What the log wrote so far, as `diag.load` reads it (the partial second closed)."""
    log.close()
    return diag.load(str(path)).proc


def test_duty_counts_a_real_process_stopped_and_resumed(tmp_path):
    """A real process, SIGSTOPped 40 ms of every 100 ms from a thread, looked at every 20 ms: seen
    stopped at a share of the looks and resumed many times; a running one never. The looks kept in
    the trace directory (`ProcLog`) read back as a throttled span, the calm ones as none."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.04)
            proc.send_signal(signal.SIGCONT)
            done.wait(0.06)

    try:
        _job({}).write(str(tmp_path))
        log = ProcLog(str(tmp_path), "h")
        calm = Deaths(log)
        _look(calm, proc.pid, 1.2)
        assert calm.duty(0)["stopped_share"] == 0 and calm.duty(0)["resumes"] == 0
        assert throttled_spans(_kept(log, tmp_path), WINDOW_S, STOPPED_SHARE, RESUMES) == {}
        t = threading.Thread(target=cycle, daemon=True)
        t.start()
        deaths = Deaths(log)
        _look(deaths, proc.pid, 2.0)
        done.set()
        t.join()
        (span,) = throttled_spans(_kept(log, tmp_path), WINDOW_S, STOPPED_SHARE, RESUMES).values()
        assert span["stopped_share"] >= STOPPED_SHARE and span["resumes"] >= RESUMES, span
        d = deaths.duty(0)
        # 20 cycles in 2 s; looks delayed by load still see several (the rule asks >= 10%, >= 3)
        assert 0.1 <= d["stopped_share"] <= 0.8 and d["resumes"] >= 3, d
        assert 1.5 <= d["looked_s"] <= 5.0
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_a_rank_named_throttled_stays_named_until_its_premise_falls_well_below(tmp_path):
    """Hysteresis (live): a rank stopped 40 ms on every third step while rank 0 is 10 ms late on
    every other step causes about half of the waiting: not enough to be named (>= 55%), enough to
    stay named (>= 40%) once the watcher named it; a share stopped of 7% likewise (10% / 5%)."""
    stalls = {s: 40.0 for s in range(0, STEPS, 3)}
    # the watch's first analysis names it on a clear premise, and marks it for the next one
    named = named_throttled(
        fired(_with_fact(_job(stalls).write(str(tmp_path / "a")), 1, **DUTY), "straggler")
    )
    assert named == {1}
    trace = _job(stalls, every_step_late=0).write(str(tmp_path))
    assert fired(_with_fact(trace, 1, **DUTY), "straggler") == []
    (f,) = fired(_with_fact(trace, 1, **DUTY, named=1 in named), "straggler")
    assert f.ranks == [1] and 0.40 <= f.evidence["caused_share"] < 0.55, f.evidence
    # priced by its peers' wait for it (>= 5% of the wall time when held): never an info the
    # stream leaves out (the public DDP tutorial's flapping: 3% by its compute excess)
    assert (
        f.severity in ("warning", "critical")
        and f.evidence["time_lost_s"] >= 0.05 * f.evidence["time_at_stake_s"]
    )
    low = {**DUTY, "stopped_share": 0.07, "resumes": 2}
    clear = _job(stalls).write(str(tmp_path / "alone"))
    assert fired(_with_fact(clear, 1, **low), "straggler") == []
    assert [f.ranks for f in fired(_with_fact(clear, 1, **low, named=True), "straggler")] == [[1]]
    # well below: stopped 3% of the looks, or nobody waits for it any more
    gone = {**low, "stopped_share": 0.03}
    assert fired(_with_fact(clear, 1, **gone, named=True), "straggler") == []
    calm = _job({}, every_step_late=0).write(str(tmp_path / "calm"))
    assert all(1 not in f.ranks for f in fired(_with_fact(calm, 1, **DUTY, named=True), "straggler"))


def _looks(log: ProcLog, states: dict[int, Callable[[int], str]], start: int, end: int) -> None:
    """The watcher's looks every 20 ms from `start` to `end` (ns): each rank's state at that time."""
    for now in range(start, end, int(LOOK_S * 1e9)):
        log.add({r: {"pid": 100 + r, "state": state(now), "checked_ns": now} for r, state in states.items()})
    log.close()


def _duty_cycle(since: int, until: int) -> Callable[[int], str]:
    """Stopped 40 ms of every 100 ms between `since` and `until`, running (R) otherwise."""
    return lambda now: "T" if since <= now < until and (now - since) % (100 * MS) < 40 * MS else "R"


def test_the_post_mortem_names_a_throttled_rank_from_the_looks_the_watcher_kept(tmp_path):
    """`diag watch` keeps its looks in the trace directory (proc-<host>.jsonl); `diag analyze` then
    names the throttled rank as the live watch did, over the steps begun while it was throttled.
    Without the file, or with a calm or a hung rank in it, it says nothing of a throttle."""
    stalls = {s: 40.0 for s in range(0, STEPS, 3)}
    job = _job(stalls)
    end = T0 + int(STEPS * (STEP_MS + 1) * MS)
    trace = job.write(str(tmp_path / "none"))
    assert all("stopped from outside" not in f.title for f in fired(trace, "straggler"))
    runs = {
        "throttled": _duty_cycle(T0 + 150 * MS, end),
        "calm": lambda now: "R",
        "hung": lambda now: "T" if now >= T0 + 150 * MS else "R",
    }
    said = {}
    for name, rank1 in runs.items():
        path = str(tmp_path / name)
        job.write(path)
        _looks(ProcLog(path, "h"), {0: lambda now: "S", 1: rank1}, T0 - 2000 * MS, end)
        trace = diag.load(path)
        assert set(trace.proc["of_rank"]) == {0, 1} and trace.proc["looks"].sum() > 0
        said[name] = [f for f in fired(trace, "straggler") if "stopped from outside" in f.title]
    (f,) = said["throttled"]
    assert f.ranks == [1] and f.evidence["affected_steps"] == [3, 6, 9], f.evidence
    assert 0.3 <= f.evidence["stopped_share"] <= 0.5 and f.evidence["resumes"] >= 7  # 8 cycles in 0.8 s
    assert said["calm"] == [] and said["hung"] == []


def test_the_looks_kept_bound_the_throttled_span():
    """A throttle of 3 s in the middle of 12 s of looks: the span found is those 3 s, with the live
    window's thresholds; a rank stopped once (a debugger, a hang) has no span."""
    import pandas as pd

    from diag.metrics.throttle import throttled_spans

    recs = []
    t = T0
    for sec in range(12):
        stopped = 40 if 4 <= sec < 7 else 0
        recs.append(
            {
                "ts": t + (sec + 1) * 1000 * MS,
                "of_rank": 1,
                "span": 1000 * MS,
                "looks": 50,
                "stopped": stopped // 2,
                "resumes": 10 if stopped else 0,
                "first_stop": t + sec * 1000 * MS + 5 * MS if stopped else None,
                "last_stop": t + (sec + 1) * 1000 * MS - 5 * MS if stopped else None,
            }
        )
    once = [  # stopped the 3 s through, resumed once after
        {**r, "of_rank": 2, "resumes": int(sec == 7), "stopped": 50 if r["stopped"] else 0}
        for sec, r in enumerate(recs)
    ]
    spans = throttled_spans(pd.DataFrame(recs + once), 5.0, 0.10, 3)
    assert set(spans) == {1}
    s = spans[1]
    # (a column with nulls is read as floats: exact to 256 ns)
    assert s["first_stop_ns"] == pytest.approx(T0 + 4005 * MS, abs=1000)
    assert s["last_stop_ns"] == pytest.approx(T0 + 6995 * MS, abs=1000)
    assert (
        s["stopped_share"] == pytest.approx(0.4)
        and s["resumes"] == 30
        and s["looked_s"] == pytest.approx(3.0)
    )
