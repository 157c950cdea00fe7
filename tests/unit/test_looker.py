"""The looks at the ranks' processes come from a looker process (`diag.live.looker`), not from a thread
of the follower: a killed rank's exit status is readable only until its launcher reaps it (torchrun:
within 0.1 s), and the follower's analyses hold the GIL for longer than that (pandas calls: looks up
to 0.8 s apart on a loaded host; `diag top` then named no death). Here the follower's main thread
holds the GIL in one C call (a sort) while a launcher-like parent kills its child and reaps it 0.25 s
later: the looks must have seen the zombie's status all the same."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from typing import Any

from diag.live.looker import Looker
from diag.live.rank_deaths import Deaths

REAP_AFTER_S = 0.25  # the launcher-like parent reaps its killed child this long after the kill
LAUNCHER = textwrap.dedent(
    f"""
    import os, signal, subprocess, sys, time
    kids = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    print(" ".join(str(k.pid) for k in kids), flush=True)
    sys.stdin.readline()  # the test holds the GIL from now on
    os.kill(kids[0].pid, signal.SIGKILL)
    time.sleep({REAP_AFTER_S})
    kids[0].wait()
    print("reaped", flush=True)
    sys.stdin.readline()
    kids[1].kill()
    kids[1].wait()
    """
)


def _until(check: Any, what: str, within: float = 15.0) -> None:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < within, what
        time.sleep(0.01)


def test_a_zombie_is_seen_while_the_follower_holds_the_gil():
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdin is not None and launcher.stdout is not None
    try:
        dead, peer = map(int, launcher.stdout.readline().split())
        host = socket.gethostname()
        headers = {0: {"pid": dead, "host": host}, 1: {"pid": peer, "host": host}}
        deaths = Deaths()
        data = [random.random() for _ in range(3_000_000)]
        with deaths.following(lambda: headers, host):
            _until(lambda: len(deaths.states.get(0, ())) >= 3, "no looks at the ranks")
            launcher.stdin.write("kill\n")
            launcher.stdin.flush()
            t0 = time.monotonic()
            sorted(data)  # one C call: no other thread of this process runs until it returns
            held = time.monotonic() - t0
            assert launcher.stdout.readline().strip() == "reaped"
            _until(lambda: 0 in deaths.exits, f"the zombie's status was never seen (GIL held {held:.2f} s)")
        assert held > REAP_AFTER_S, f"the sort held the GIL {held:.2f} s only: the test proves nothing"
        assert deaths.exits[0] == signal.SIGKILL  # killed by SIGKILL: its wait status is the signal
        assert deaths.split is not None and deaths.split[1]["state"] != "gone", deaths.split
    finally:
        launcher.stdin.write("end\n")
        launcher.stdin.flush()
        launcher.wait(timeout=10)


def test_the_looker_says_each_look_and_ends_with_its_follower():
    sleeper = subprocess.Popen(["sleep", "60"])
    looker = Looker()
    try:
        looker.want({3: sleeper.pid, 4: 1 << 22})  # a pid no process has
        looks: list[dict[int, dict[str, Any]]] = []
        _until(lambda: looks.extend(looker.looks(0.1) or []) or len(looks) >= 3, "no looks")
        assert looks[-1][3]["pid"] == sleeper.pid and looks[-1][3]["state"] in ("S", "R")
        assert looks[-1][4]["state"] == "gone" and "exit" not in looks[-1][4]
        stamps = [look[3]["checked_ns"] for look in looks]
        assert stamps == sorted(stamps) and stamps[-1] <= time.time_ns()
        sleeper.kill()  # the looker sees it ended at once (its pidfd), a zombie until we reap it
        _until(lambda: any("exit" in f for look in looker.looks(0.1) or [] for f in look.values()), "no end")
    finally:
        sleeper.kill()
        sleeper.wait()
        assert looker.proc.stdin is not None
        looker.proc.stdin.close()  # its follower gone: it ends by itself
        assert looker.proc.wait(timeout=5) == 0
        looker.close()


def test_a_look_read_late_keeps_the_looks_in_order():
    """A look the looker took earlier but the follower read after its own (the pipe, read late)."""
    deaths = Deaths()
    at = time.time_ns()
    for ns, state in ((0, "S"), (40, "T"), (60, "R"), (20, "T")):  # the look at 20 ms arrives last
        deaths.look({0: {"pid": 1, "state": state, "checked_ns": at + ns * 1_000_000}})
    assert [s for _, s in deaths.states[0]] == ["S", "T", "T", "R"]
    assert deaths.duty(0)["resumes"] == 1  # in arrival order it read as two


def test_the_looker_runs_none_of_the_users_site(tmp_path, monkeypatch):
    """`python -I -S`: a job's own sitecustomize (on PYTHONPATH, as users put one) is not run in it."""
    (tmp_path / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert (tmp_path / "ran").exists()  # the site file runs in a plain interpreter
    (tmp_path / "ran").unlink()
    looker = Looker()
    try:
        looker.want({0: os.getpid()})
        looks: list[dict[int, dict[str, Any]]] = []
        _until(lambda: looks.extend(looker.looks(0.1) or []) or len(looks) >= 2, "no looks")
        assert looks[-1][0]["state"] in ("R", "S")
    finally:
        looker.close()
    assert not (tmp_path / "ran").exists()


def test_a_reaped_rank_keeps_the_status_a_look_read_of_its_zombie(tmp_path):
    """The next look finds rank 0 reaped (no status left to read): the rules still get its SIGKILL,
    and the looks kept for the post-mortem have it in their second."""
    from diag.live.proc_log import ProcLog

    log = ProcLog(str(tmp_path), "h")
    deaths = Deaths(log)
    at = time.time_ns()
    deaths.look(
        {
            0: {"pid": 1, "state": "gone", "checked_ns": at, "exit": 9},
            1: {"pid": 2, "state": "R", "checked_ns": at},
        }
    )
    now = {
        0: {"pid": 1, "state": "gone", "checked_ns": at + 1},
        1: {"pid": 2, "state": "R", "checked_ns": at + 1},
    }
    deaths.look(now)
    assert deaths.facts(now)[0]["exit"] == 9 and "exit" not in deaths.facts(now)[1]
    gone = {r: {**f, "state": "gone"} for r, f in now.items()}
    assert deaths.facts(gone)[0]["exit"] == 9  # every process gone: the split, with the status
    log.close()
    with open(tmp_path / "proc-h.jsonl") as f:
        records = [json.loads(line) for line in f][1:]
    assert {r["of_rank"]: r["exit"] for r in records} == {0: 9, 1: None}


def test_a_looker_killed_is_an_end_not_an_error():
    """Its follower falls back to looking itself (`Deaths._follow`): nothing raised on its thread."""
    looker = Looker()
    try:
        looker.proc.kill()
        looker.proc.wait()
        for pids in ({0: os.getpid()}, {0: os.getpid(), 1: 1}):  # the second write meets the broken pipe
            looker.want(pids)
        assert looker.looks(0.1) is None
    finally:
        looker.close()
