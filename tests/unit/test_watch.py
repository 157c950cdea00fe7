"""`diag watch --json`: each new or changed finding once, one JSON line, with rank, group, collective,
step and time; a cleared one once; bad input is one line and a non-zero exit."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from diag.cli.watch import Stream
from diag.findings import Finding
from tests.unit.synth_trace import Job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _f(ranks: list[int], severity: str = "critical", step: int = 7) -> Finding:
    return Finding(
        rule="hang_desync",
        severity=severity,
        title=f"hang at step {step}",
        detail="",
        evidence={"group": "world", "collective": "all_reduce", "step": step},
        ranks=ranks,
    )


def test_stream_prints_each_new_changed_and_cleared_finding_once():
    out = io.StringIO()
    s = Stream(out, as_json=True)
    assert s.update([_f([1])]) == 1
    assert s.update([_f([1], step=8)]) == 0  # same verdict, a number in it moved: not news
    assert s.update([_f([0, 1])]) == 1
    assert s.update([_f([0, 1], severity="info")]) == 1  # below warning: gone from the stream
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["new", "changed", "cleared"]
    first = lines[0]
    assert (first["rule"], first["ranks"], first["group"], first["collective"], first["step"]) == (
        "hang_desync",
        [1],
        "world",
        "all_reduce",
        7,
    )
    assert first["time"] > 1.7e9 and first["since_start_s"] >= 0


def _watch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diag", "watch", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_watch_json_on_a_trace_directory(tmp_path):
    job = Job(steps=8)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=10 if r == 0 else 70, dur_ms=65 if r == 0 else 5))
    job.write(str(tmp_path / "slow"))
    res = _watch(str(tmp_path / "slow"), "--json", "--duration", "1.5", "--interval", "0.5")
    assert res.returncode == 0, res.stderr
    (line,) = [json.loads(x) for x in res.stdout.splitlines()]
    assert (line["event"], line["rule"], line["ranks"]) == ("new", "straggler", [1])
    healthy = Job(steps=8)
    healthy.each_step(lambda r, s: healthy.comm(r, s))
    healthy.write(str(tmp_path / "ok"))
    res = _watch(str(tmp_path / "ok"), "--json", "--duration", "1.5", "--interval", "0.5")
    assert res.returncode == 0 and res.stdout == "", res.stdout + res.stderr


def test_watch_bad_input_is_one_line(tmp_path):
    res = _watch(str(tmp_path / "missing"), "--json", "--duration", "1")
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = _watch(str(tmp_path), "--interval", "0")
    assert res.returncode != 0 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def _ranks_as_processes(path: str) -> list[subprocess.Popen[bytes]]:
    """A 2-rank trace whose headers name two real processes on this host (sleepers standing in for
    the ranks: the watcher looks only at whether each process runs)."""
    import socket

    job = Job(steps=8, hosts=[socket.gethostname()] * 2)
    job.each_step(lambda r, s: job.comm(r, s))
    job.write(path)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)]
    for r, proc in enumerate(procs):
        name = os.path.join(path, f"rank-{r:05d}.jsonl")
        with open(name) as f:
            lines = f.readlines()
        lines[0] = json.dumps({**json.loads(lines[0]), "pid": proc.pid}) + "\n"
        with open(name, "w") as f:
            f.writelines(lines)
    return procs


def _end(procs: list[subprocess.Popen[bytes]], first: int, gap_s: float, path: str) -> list[dict]:
    """`diag watch --json` on the trace while rank 1's process is ended by signal `first`, and rank
    0's by SIGTERM `gap_s` later, as a launcher does (it reaps the first meanwhile); the lines it
    printed before it ended by itself."""
    import signal
    import time

    watch = subprocess.Popen(
        [sys.executable, "-m", "diag", "watch", path, "--json", "--duration", "60", "--interval", "2"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        time.sleep(3.0)  # started and read the trace: no finding on the healthy start
        procs[1].send_signal(first)
        time.sleep(gap_s)
        procs[1].wait()
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait()
        out, _ = watch.communicate(timeout=30)
    finally:
        watch.kill()
    assert watch.returncode == 0
    return [json.loads(x) for x in out.splitlines()]


def test_watch_names_a_rank_the_launcher_outlived_by_a_moment(tmp_path):
    """torchrun ends the survivors soon after a rank dies (a public nanoGPT's rank 0 got SIGTERM
    0.06-0.13 s after rank 1's SIGKILL): the watch's periodic analysis (here every 2 s) then sees
    every process gone, which reads as a job that ended. Looked at every 20 ms, rank 1 was gone,
    killed by SIGKILL, while rank 0 ran: the last analysis names it."""
    import signal

    crash = str(tmp_path / "crash")
    lines = _end(_ranks_as_processes(crash), signal.SIGKILL, 0.15, crash)
    assert [(x["rule"], x["ranks"]) for x in lines if x["event"] == "new"] == [("job_crash", [1])]
    # a job stopped from outside: every rank SIGTERMed, under load 0.15 s apart: no rank died first
    stop = str(tmp_path / "stop")
    assert _end(_ranks_as_processes(stop), signal.SIGTERM, 0.15, stop) == []


def test_a_slow_analysis_stretches_the_pause(monkeypatch):
    """A long history makes each analysis slow: the pause after one is PACE times its time, so the
    watch on a training node takes at most a third of a core (each look was 6.8 s of CPU a second on
    a 1-minute DDP job before collective_mismatch was vectorized)."""
    import itertools
    import time
    from types import SimpleNamespace

    import diag.analyzers

    from diag.cli import watch
    from diag.live.looks import Looks
    from diag.tui import jobstate

    looks: list[float] = []

    def slow_run_all(trace: object) -> tuple[list[Finding], dict[str, str]]:
        looks.append(time.monotonic())
        time.sleep(0.2)
        return [], {}

    class Growing:  # a trace that grows between every two looks
        events, version, headers = 1, 0, {}

        def ingest(self, _chunks: object) -> None:
            self.version += 1

        def to_trace(self) -> SimpleNamespace:
            return SimpleNamespace(headers={})

    monkeypatch.setattr(diag.analyzers, "run_all", slow_run_all)
    monkeypatch.setattr(watch, "PACE", 2.0)
    source = SimpleNamespace(poll=lambda: [])
    stream = watch.Stream(io.StringIO(), as_json=True)
    args = SimpleNamespace(interval=0.01)
    watch._loop(args, source, Growing(), jobstate.JobState(), stream, Looks(), time.monotonic() + 2.5)
    gaps = [b - a for a, b in itertools.pairwise(looks)]
    assert gaps and min(gaps) >= 0.57, gaps  # 0.2 s analysing, then >= 0.4 s paused (not 0.01)


def _priced(share: float, severity: str | None = None) -> Finding:
    from diag.findings import Cost

    cost = Cost(share * 0.1, 0.1)  # of a 100 ms step
    return Finding(
        rule="straggler",
        severity=severity or cost.severity,
        title="rank 1 is a straggler",
        detail="",
        evidence=cost.evidence(),
        ranks=[1],
    )


def _live(shares: list[tuple[float, str | None]]) -> list[tuple[str, str | None]]:
    """What `diag watch --json` prints of one straggler finding over analyses with these shares."""
    from types import SimpleNamespace

    from diag.live.looks import Looks

    out, looks = io.StringIO(), Looks()
    stream = Stream(out, as_json=True)
    for share, severity in shares:
        found = [_priced(share, severity)]
        findings, _ = looks.analyze(SimpleNamespace(headers={}), {}, lambda t, found=found: (found, {}))
        stream.update(findings)
    return [(e["event"], e.get("severity")) for e in map(json.loads, out.getvalue().splitlines())]


def test_a_severity_swinging_across_its_threshold_is_printed_once():
    """A rank throttled 40 ms of every 100 ms cost its peers 19-40% of the wall time from one
    analysis to the next (DDP, load 1.4): the watch printed the straggler again at each crossing of
    25% (critical, warning, critical, ...). Held, it falls back once it is well below (15%, 3%);
    a rise still shows at once."""
    swings = [0.35, 0.23, 0.19, 0.30, 0.16, 0.21, 0.12, 0.08, 0.04, 0.02]
    assert _live([(s, None) for s in swings]) == [
        ("new", "critical"),
        ("changed", "warning"),  # 12%: under 15%
        ("cleared", None),  # 2%: under 3% (4% was held a warning)
    ]
    assert _live([(0.10, None), (0.26, None), (0.24, None)]) == [("new", "warning"), ("changed", "critical")]
    # a severity the rule chose otherwise (not its share's: a precision guard) is not held
    assert _live([(0.30, None), (0.30, "warning")]) == [("new", "critical"), ("changed", "warning")]


def test_two_findings_of_one_rule_are_two_entries():
    """exposed_comm can give two findings at once (the hideable part, the tensor-parallel part):
    keyed by rule alone, the second replaced the first's signature and the first read "changed" on
    every pass of an unchanged job."""
    hideable = Finding(rule="exposed_comm", severity="critical", title="a", detail="", ranks=[0, 1])
    tp = Finding(rule="exposed_comm", severity="warning", title="b", detail="", ranks=[0, 1])
    out = io.StringIO()
    s = Stream(out, as_json=True)
    assert s.update([hideable, tp]) == 2
    assert s.update([hideable, tp]) == 0  # nothing changed: nothing printed
    assert s.update([hideable]) == 1  # the second is gone: one "cleared", named by its rule
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(x["event"], x["rule"]) for x in lines] == [
        ("new", "exposed_comm"),
        ("new", "exposed_comm"),
        ("cleared", "exposed_comm"),
    ]


def test_a_paced_pause_ends_when_a_rank_is_seen_gone():
    """After a slow analysis the watch pauses twice its time; a rank the looks see gone meanwhile
    ends the pause (its death named at once), a rank seen stopped and running by turns (a throttle)
    does not (an analysis every look would undo the pace)."""
    import threading
    import time

    from diag.cli import watch
    from diag.live.looks import Looks

    looks = Looks()
    at = time.time_ns()

    def look(state: str, ns: int) -> None:
        looks.deaths.look(
            {0: {"pid": 1, "state": "S", "checked_ns": ns}, 1: {"pid": 2, "state": state, "checked_ns": ns}}
        )

    look("S", at)
    flips = threading.Thread(
        target=lambda: [look("TR"[i % 2], at + i) or time.sleep(0.02) for i in range(1, 40)]
    )
    t0 = time.monotonic()
    flips.start()
    watch._rest(1.0, looks, frozenset())
    assert time.monotonic() - t0 >= 0.95  # the throttle's stops woke nothing
    flips.join()
    threading.Timer(0.3, look, args=("gone", at + 100)).start()
    t0 = time.monotonic()
    watch._rest(5.0, looks, frozenset())
    assert 0.25 <= time.monotonic() - t0 < 1.5


def test_an_ended_job_is_left_when_its_grace_ends_not_after_a_paced_pause(monkeypatch):
    """Once the job's processes are gone the watch reads their last flush when ENDED_GRACE_S ends:
    no pause past it, however slow the analyses (twice their time kept the watch 8-11 s after a
    killed DDP job on a loaded host)."""
    import time
    from types import SimpleNamespace

    import diag.analyzers

    from diag.cli import watch
    from diag.live.looks import Looks

    def slow_run_all(trace: object) -> tuple[list[Finding], dict[str, str]]:
        time.sleep(0.2)
        return [], {}

    class Growing:  # a job whose last records keep coming in
        events, version, headers = 1, 0, {0: {}}

        def ingest(self, _chunks: object) -> None:
            self.version += 1

        def to_trace(self) -> SimpleNamespace:
            return SimpleNamespace(headers={})

    rests: list[float] = []

    def rest(seconds: float, looks: object, gone: object) -> None:
        rests.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(diag.analyzers, "run_all", slow_run_all)
    monkeypatch.setattr(watch, "PACE", 2.0)
    monkeypatch.setattr(watch, "ENDED_GRACE_S", 0.3)
    monkeypatch.setattr(watch, "_rest", rest)
    ended = SimpleNamespace(check=lambda headers: "ended")
    args = SimpleNamespace(interval=0.01)
    stream = watch.Stream(io.StringIO(), as_json=True)
    t0 = time.monotonic()
    code = watch._loop(args, SimpleNamespace(poll=lambda: []), Growing(), ended, stream, Looks(), None)
    assert code == 0
    assert rests and max(rests) <= 0.3, rests  # (paced: 0.4, twice the analysis)
    assert time.monotonic() - t0 < 5
