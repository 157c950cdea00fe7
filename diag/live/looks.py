"""The ranks' processes as a live follower hands them to the rules: `diag watch` and `diag top` alike.

Each analysis of a live job reads, per rank on this host, its process fact (`rank_deaths`: running,
stopped, gone and how, its recent stops and resumes) in `trace.headers[rank]["process"]`, with
`named` for the ranks the previous analysis named throttled from outside (the straggler rule holds
them named until their premise falls well below its thresholds). Without these looks a follower names
a hang or a dead rank only from the silence of its trace, seconds later, and never a throttled rank.
A priced finding's severity is held the same way from one analysis to the next
(`findings.held_severity`): the stream prints it again only when it really changed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from diag.findings import held_severity
from diag.live.rank_deaths import Deaths, Facts, process_facts

if TYPE_CHECKING:
    from diag.live.proc_log import ProcLog
    from diag.trace.model import Trace

Analyze = Callable[["Trace"], tuple[list[Any], dict[str, str]]]
QUIET = ("R", "S", "D", "I")  # a running or sleeping process (/proc State letters): nothing to tell


def named_throttled(findings: list[Any]) -> set[int]:
    """Ranks a straggler finding names as throttled from outside: the next analysis holds them
    named until their premise falls well below the thresholds (the rule's `HOLD`)."""
    held = [f for f in findings if f.rule == "straggler" and "stopped_share" in (f.evidence or {})]
    return {r for f in held for r in f.ranks}


class Looks:
    """A follower's looks at the ranks' processes on this host, the throttled ranks and the severities
    its last analysis showed."""

    def __init__(self, log: ProcLog | None = None, host: str | None = None) -> None:
        self.host = host or socket.gethostname()
        self.deaths = Deaths(log)  # `log`: where the looks are kept for the post-mortem (one writer)
        self.throttled: set[int] = set()  # ranks the last analysis named throttled from outside
        self.severities: dict[tuple[str, tuple[int, ...]], str] = {}  # as the last analysis showed them

    def following(self, headers: Callable[[], dict[int, dict[str, Any]]]) -> AbstractContextManager[None]:
        """A thread looking every `rank_deaths.LOOK_S` while in the block (see `Deaths.following`)."""
        return self.deaths.following(headers, self.host)

    def look(self, headers: dict[int, dict[str, Any]]) -> Facts:
        """One look now at every rank of this host, as the rules should read it."""
        facts = process_facts(headers, self.host, time.time_ns())
        self.deaths.look(facts)
        return self.deaths.facts(facts)

    def latest(self) -> Facts:
        """The ranks as the looks taken so far say (no new look), read as `look` reads them: what
        a paced follower compares with what its last analysis read (`ended`), to wake for a death."""
        with self.deaths.lock:
            raw = {r: {"state": seen[-1][1]} for r, seen in self.deaths.states.items() if seen}
        return self.deaths.facts(raw)

    def analyze(self, trace: Trace, facts: Facts, analyze: Analyze) -> tuple[list[Any], dict[str, str]]:
        """`analyze(trace)` with the facts in its headers, its findings' severities held; remembers
        whom it named throttled."""
        for rank, fact in facts.items():
            trace.headers.setdefault(rank, {})["process"] = {**fact, "named": rank in self.throttled}
        findings, failures = analyze(trace)
        self.throttled = named_throttled(findings)
        self.severities = hold_severities(findings, self.severities)
        return findings, failures


def hold_severities(
    findings: list[Any], before: dict[tuple[str, tuple[int, ...]], str]
) -> dict[tuple[str, tuple[int, ...]], str]:
    """Each finding's severity held against the previous analysis' (same rule and ranks), in place;
    returns the severities now shown."""
    now = {}
    for f in findings:
        key = (f.rule, tuple(sorted(f.ranks)))
        share = (f.evidence or {}).get("time_lost_share")
        f.severity = held_severity(f.severity, share, before.get(key))
        now[key] = f.severity
    return now


def news(facts: Facts) -> tuple[tuple[int, str, bool], ...]:
    """What of the facts the rules turn into a verdict: per rank its state (running or sleeping are
    one: a training rank flips between them), and whether it was seen stopped lately (a throttle).
    The same news twice asks for no new analysis of unchanged data."""
    return tuple(
        sorted(
            (r, "up" if f["state"] in QUIET else str(f["state"]), bool(f.get("stopped_share")))
            for r, f in facts.items()
        )
    )


def ended(facts: Facts) -> frozenset[int]:
    """The ranks whose process is gone (dead, or ended by a stop signal): a change a paced follower
    wakes for. Not a stop (T): a throttled rank is seen stopped and running by turns."""
    return frozenset(r for r, f in facts.items() if f["state"] in ("gone", "stopped_by_signal"))


def alarming(facts: Facts) -> bool:
    """A rank stopped, gone, or seen stopped in the recent looks: worth an analysis every refresh."""
    return any(f["state"] not in QUIET or f.get("stopped_share") for f in facts.values())
