"""The ranks' processes as a live follower (`diag watch`, `diag top`) sees them: running, stopped, or
gone, and how a gone one ended.

A rank that dies is often followed within a moment by the others: torchrun sent SIGTERM to a public
nanoGPT's rank 0 0.06-0.13 s after rank 1's SIGKILL, so an analysis once a second saw every
process gone, which reads as a job that ended. A thread looks every 20 ms; a rank seen gone while a
peer still ran died first when its exit status says it failed (a signal other than a stop, or a
non-zero exit code): a zombie's /proc/<pid>/stat holds it until the launcher reaps it. Killed by a
stop signal (SIGTERM, SIGINT, SIGHUP: the job stopped from outside; under load the ranks of a
torchrun stopped with SIGTERM died 40+ ms apart, rank 0 first) it did not crash, and an exit
status never seen (reaped between two looks) proves nothing.

The looks also keep, per rank, how often its process was seen stopped (state T) over the last
`DUTY_WINDOW_S` and how many times it resumed: a rank stopped and resumed again and again is being
throttled from outside (a SIGSTOP/SIGCONT duty cycle, as cpulimit does), which nothing in its own
trace tells apart from a rank that merely lost the CPU to a loaded host (`duty`; the straggler rule
reads it as the header's `process` fact `stopped_share`, `resumes`, `looked_s`).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from diag.live.looker import LOOK_S, Looker, fact_of
from diag.metrics.throttle import WINDOW_S as DUTY_WINDOW_S
from diag.vocab import STOP_SIGNALS

if TYPE_CHECKING:
    from diag.live.proc_log import ProcLog

_STOPS = {int(getattr(signal, name)) for name in STOP_SIGNALS}

Facts = dict[int, dict[str, Any]]


def crashed(status: int) -> bool:
    """A wait status of a process that failed: killed by a signal other than a stop, or exit != 0."""
    sig = status & 0x7F
    return sig not in _STOPS if sig else (status >> 8) != 0


def local_pids(headers: dict[int, dict[str, Any]], host: str) -> dict[int, int]:
    """{rank: pid} of the ranks whose process runs on this host (a sidecar is no rank)."""
    return {
        rank: h["pid"]
        for rank, h in headers.items()
        if rank >= 0 and h.get("host") == host and isinstance(h.get("pid"), int) and not h.get("sidecar")
    }


def process_facts(headers: dict[int, dict[str, Any]], host: str, now_ns: int) -> Facts:
    """Per rank whose process runs on this host: whether it is still there and its state letter
    (R, S, T: stopped, gone; a zombie is gone, its wait status as `exit`), as the rules read them
    (`schema`-free header key `process`)."""
    return {rank: fact_of(pid, now_ns) for rank, pid in local_pids(headers, host).items()}


class Deaths:
    """How each rank's process ended, and the processes as they were when some ranks had died
    while the others still ran: what the analysis reads once every process is gone."""

    def __init__(self, log: ProcLog | None = None) -> None:
        self.log = log  # where the looks are kept for the post-mortem (diag.live.proc_log)
        self.split: Facts | None = None
        self.exits: dict[int, int] = {}  # rank -> wait status, once seen
        self.states: dict[int, deque[tuple[int, str]]] = {}  # rank -> (checked_ns, state), recent
        self.lock = threading.Lock()

    def look(self, facts: Facts) -> None:
        gone = frozenset(r for r, f in facts.items() if f["state"] == "gone")
        with self.lock:
            for r, f in facts.items():
                seen = self.states.setdefault(r, deque())
                if seen and seen[-1][0] > f["checked_ns"]:  # a look read late (the looker's pipe)
                    bisect.insort(seen, (f["checked_ns"], f["state"]))
                else:
                    seen.append((f["checked_ns"], f["state"]))
                while seen[0][0] < f["checked_ns"] - DUTY_WINDOW_S * 1e9:
                    seen.popleft()
            self.exits.update({r: f["exit"] for r, f in facts.items() if "exit" in f})
            if self.log is not None:
                self.log.add(facts)
            if self.split is not None or not facts:
                return
            if gone and gone != set(facts) and all(r in self.exits and crashed(self.exits[r]) for r in gone):
                self.split = facts

    def duty(self, rank: int) -> dict[str, Any]:
        """Over the recent looks at `rank`: the share seen stopped (T), the times it resumed (T, then
        running or sleeping), the seconds looked at and when it was first seen stopped: a duty cycle
        when it resumes again and again."""
        with self.lock:
            seen = list(self.states.get(rank, ()))
        if len(seen) < 2:
            return {}
        states = [s for _, s in seen]
        resumes = sum(a == "T" and b not in ("T", "gone") for a, b in itertools.pairwise(states))
        stops = [t for t, s in seen if s == "T"]
        return {
            "stopped_share": states.count("T") / len(states),
            "resumes": resumes,
            "looked_s": (seen[-1][0] - seen[0][0]) / 1e9,
            "first_stop_ns": stops[0] if stops else None,
        }

    def facts(self, facts: Facts) -> Facts:
        """`facts` as the rules should read them: once every process is gone, the split seen
        earlier, if any; while some run, a rank ended by a stop signal is "stopped_by_signal", not
        gone (a crash); a running rank's recent stops and resumes (`duty`) beside its state."""
        with self.lock:
            exits = dict(self.exits)
            if facts and all(f["state"] == "gone" for f in facts.values()):
                facts = self.split or facts
                return {r: _with_exit(f, exits.get(r)) for r, f in facts.items()}
        stopped = {r for r, s in exits.items() if not crashed(s)}
        return {
            r: {**f, "state": "stopped_by_signal"}
            if r in stopped
            else _with_exit({**f, **self.duty(r)}, exits.get(r))
            for r, f in facts.items()
        }

    @contextlib.contextmanager
    def following(self, headers: Callable[[], dict[int, dict[str, Any]]], host: str) -> Iterator[None]:
        """A thread looking every `LOOK_S` while in the block (`headers()`: the ranks seen so far)."""
        stop = threading.Event()
        thread = threading.Thread(
            target=self._follow, args=(headers, host, stop), name="diag-looks", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()  # within a look: none outlives its follower (nor writes after the log closed)

    def _follow(
        self, headers: Callable[[], dict[int, dict[str, Any]]], host: str, stop: threading.Event
    ) -> None:
        """The looks of a looker process (`diag.live.looker`: taken on time whatever this process'
        analyses hold), or from this thread where none starts or it ended."""
        looker = _start_looker()
        try:
            while not stop.is_set():
                try:
                    known = dict(headers())
                except RuntimeError:  # the main thread added a rank meanwhile: the next look has it
                    known = None
                if looker is None:
                    if known:
                        self.look(process_facts(known, host, time.time_ns()))
                    stop.wait(LOOK_S)
                    continue
                if known is not None:
                    looker.want(local_pids(known, host))
                looks = looker.looks(5 * LOOK_S)
                if looks is None:
                    looker.close()
                    looker = None
                    continue
                for facts in looks:
                    if facts:
                        self.look(facts)
        finally:
            if looker is not None:
                looker.close()


def _with_exit(fact: dict[str, Any], status: int | None) -> dict[str, Any]:
    """A gone rank's fact with the wait status an earlier look saw (the look now finds it reaped)."""
    return {**fact, "exit": status} if fact["state"] == "gone" and status is not None else fact


def _start_looker() -> Looker | None:
    try:
        return Looker()
    except OSError:  # no interpreter to start (a frozen follower), no fork left: look from here
        return None
