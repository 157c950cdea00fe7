"""Follow a live job's findings as a stream: each new or changed finding printed once (--json: one line).

  diag watch                 follow ./diag-trace (or $DIAG_TRACE_DIR)
  diag watch <trace-dir>     follow a trace directory as it grows
  diag watch <pid>           follow an attached process (its control socket gives the trace)
  diag watch <dir> --json    one JSON object a line: what alerting, exporters and bench/faults read

Every `--interval` seconds it reads what the ranks wrote, runs every rule on the trace so far, and
prints a finding when it first appears, when its severity (held until clearly below its threshold:
`findings.held_severity`) or named ranks change, and once when it clears. Each rank's process on
this host is looked at too (gone, or stopped; `diag.live`, as `diag top` does): the rules name a
rank whose process died or froze (job_crash, hang_desync), also one whose launcher ended the others
within a moment (the last analysis reads the processes as they were when it died). What the looks
saw is kept in the trace directory (`proc-<host>.jsonl`, `proc_log`): the post-mortem names a rank
throttled from outside from it, as the watch did live. Ends when the job's processes are gone (after
a last analysis), at --duration, or on Ctrl-C.
The watch runs on the training nodes: when an analysis takes longer than half the period (a long
history: `diag.tui.model.MAX_RAW` records of each kind are kept), the pause after it is twice its
time, so the watch takes at most a third of a core from the job.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

from diag.errors import USAGE, DiagError
from diag.live.looks import Looks, ended
from diag.live.proc_log import ProcLog

ENDED_GRACE_S = 2.0  # after the job's processes are gone: one more read of what they flushed
PACE = 2.0  # pause >= PACE x the last analysis's time: at most 1 / (1 + PACE) of a core
WAKE_S = 0.1  # during a pause, how often the looks are read for a rank's change (no look taken)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", help="trace directory or pid (default: ./diag-trace)")
    parser.add_argument("--json", action="store_true", help="one JSON object a line")
    parser.add_argument("--interval", type=float, default=1.0, help="analysis period, seconds (default 1)")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")


def event_of(f: Any, kind: str, t0: float) -> dict[str, Any]:
    """One line of the stream: the finding's rule, severity, ranks, group, collective and step."""
    ev = f.evidence or {}
    return {
        "event": kind,
        "time": round(time.time(), 3),
        "since_start_s": round(time.monotonic() - t0, 2),
        "rule": f.rule,
        "severity": f.severity,
        "ranks": list(f.ranks),
        "group": ev.get("group"),
        "collective": ev.get("collective"),
        "step": ev.get("step", f.steps[-1] if f.steps else None),
        "title": f.title,
    }


class Stream:
    """Which findings were printed, to print each new or changed one once."""

    def __init__(self, out: Any, as_json: bool) -> None:
        self.out, self.as_json = out, as_json
        self.shown: dict[str, tuple[Any, ...]] = {}
        self.t0 = time.monotonic()

    def update(self, findings: list[Any]) -> int:
        """Print what changed since the last analysis; returns the number of lines printed."""
        seen: dict[str, tuple[Any, ...]] = {}
        lines: list[dict[str, Any]] = []
        count: dict[str, int] = {}
        for f in findings:
            if f.severity not in ("warning", "critical"):
                continue
            ev = f.evidence or {}
            # a rule may give several findings (exposed_comm: the hideable part and the tensor-
            # parallel part): each its own entry, by its place among its rule's, or the later one's
            # signature replaced the earlier's and the earlier read "changed" on every pass
            n = count[f.rule] = count.get(f.rule, 0) + 1
            key = f.rule if n == 1 else f"{f.rule}#{n}"
            sig = (f.severity, tuple(f.ranks), ev.get("group"), ev.get("collective"))
            seen[key] = sig
            if key not in self.shown:
                lines.append(event_of(f, "new", self.t0))
            elif self.shown[key] != sig:
                lines.append(event_of(f, "changed", self.t0))
        for key in sorted(set(self.shown) - set(seen)):
            lines.append({"event": "cleared", "time": round(time.time(), 3), "rule": key.split("#")[0]})
        self.shown = seen
        for line in lines:
            self.out.write((json.dumps(line) if self.as_json else _text(line)) + "\n")
        self.out.flush()
        return len(lines)


def _text(e: dict[str, Any]) -> str:
    if e["event"] == "cleared":
        return f"{time.strftime('%H:%M:%S')} cleared {e['rule']}"
    where = ", ".join(
        f"{k} {e[k]}" for k in ("group", "collective", "step") if e.get(k) is not None and e.get(k) != ""
    )
    return (
        f"{time.strftime('%H:%M:%S')} {e['event']} {e['severity'].upper()} {e['rule']} ranks {e['ranks']}: "
        f"{e['title']}" + (f" [{where}]" if where else "")
    )


def run(args: argparse.Namespace) -> int:
    from diag.tui import jobstate
    from diag.tui.model import JobModel
    from diag.tui.source import LiveSource, trace_dir_of_pid

    if args.interval <= 0:
        raise DiagError("--interval must be > 0", USAGE)
    target = args.target or os.environ.get("DIAG_TRACE_DIR") or "diag-trace"
    if target.isdigit() and not os.path.isdir(target):
        target = trace_dir_of_pid(int(target))
    source, model, state = LiveSource(target), JobModel(), jobstate.JobState()
    stream = Stream(sys.stdout, args.json)
    log = ProcLog(target, socket.gethostname())  # the looks kept: `diag top` reads them, never writes
    looks = Looks(log)
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        with looks.following(lambda: model.headers):
            return _loop(args, source, model, state, stream, looks, deadline)
    finally:
        with looks.deaths.lock:
            log.close()


def _loop(
    args: argparse.Namespace,
    source: Any,
    model: Any,
    state: Any,
    stream: Stream,
    looks: Looks,
    deadline: float | None,
) -> int:
    """Read, analyze and print every `--interval` until the job ended (or `--duration`)."""
    from diag.analyzers import run_all

    analyzed, ended_at = -1, None
    while True:
        model.ingest(source.poll())
        facts = looks.look(model.headers)
        pause = args.interval
        if model.events and (model.version != analyzed or facts):
            analyzed, began = model.version, time.monotonic()
            findings, _ = looks.analyze(model.to_trace(), facts, run_all)
            stream.update(findings)
            pause = max(pause, PACE * (time.monotonic() - began))
        if model.headers and state.check(model.headers) == "ended":
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at >= ENDED_GRACE_S:
                return 0
            # the job is over: its last flush is read when the grace ends, not after a paced pause
            # (twice a slow analysis: the watch outlived a killed DDP job by 8-11 s on a loaded host)
            pause = min(pause, ENDED_GRACE_S - (time.monotonic() - ended_at))
        if deadline is not None and time.monotonic() >= deadline:
            return 0
        rest = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
        _rest(rest, looks, ended(facts))


def _rest(seconds: float, looks: Looks, gone: frozenset[int]) -> None:
    """Pause `seconds`, or less: a rank's process seen gone since the last analysis read the facts
    (`gone`: the ranks gone then) ends it. A paced pause after a slow analysis on a loaded host left
    a dead rank unnamed for 2-5 s (a new user's DDP check, session 29)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(WAKE_S, left))
        if ended(looks.latest()) != gone:
            return
