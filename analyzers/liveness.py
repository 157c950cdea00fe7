"""Whether each rank's process still runs, as far as a trace can tell: shared by hang_desync and
dead_rank (rules do not import each other).

Three measured signs, none of them silence alone:
- the agent's close: `agent.stop()` always writes `unfinished_at_detach` (the comms collector's
  count of ops in flight), so a trace without it ended without the agent closing it (a kill, a
  crash of the interpreter, or the job is still running);
- the heartbeat: the agent's writer thread writes a stats record every 2 s whatever the training
  thread does (blocked in a collective included), so a rank whose records stop while a peer's go
  on is a process that stopped running (SIGSTOP, a dead process, a frozen interpreter);
- the process itself, looked at by a live watcher on the ranks' host (`diag watch` adds
  `headers[rank]["process"] = {"pid", "state", "checked_ns"}`: state "gone", or a /proc State letter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from diag import schema
from diag.metrics import lasts
from diag.metrics.comms import comm_frame
from diag.metrics.steps import NS

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

HEARTBEAT_S = 2.0  # the agent's stats period (diag.agent.runtime.STATS_INTERVAL_S)
SILENT_BEATS = 3  # a rank this many heartbeats behind a peer's latest record stopped running
FIRST_BY_S = 1.25  # every process gone: a rank whose records end this long (2.5 of the agent's 0.5 s
# flushes, diag.agent.runtime.FLUSH_INTERVAL_S) before the others' died first


def live(trace: Trace) -> bool:
    """A trace read while the job runs (`diag top`, `diag watch`): its files end mid-flush."""
    watched = any(isinstance(h.get("process"), dict) for h in trace.headers.values())
    return watched or "diag top" in trace.sources


def closed(trace: Trace) -> set[int]:
    """Ranks whose agent closed their trace (the close marker is in its metadata)."""
    return {r for r, h in trace.headers.items() if schema.META_UNFINISHED_AT_DETACH in h}


def process_state(trace: Trace, rank: int) -> str | None:
    """The live watcher's look at a rank's process: "gone", a /proc State letter, None unknown.
    After the job (no live look), "T" where the watcher's looks kept in the trace (`proc` records)
    last saw the process stopped before it was gone: a rank that hung stopped until the job was
    killed. Only a stop is read back: its other last looks (running, gone with every rank when the
    job was killed) say nothing a finished trace does not."""
    fact = trace.headers.get(rank, {}).get("process")
    if isinstance(fact, dict):
        return str(fact.get("state")) if fact.get("state") else None
    return "T" if watched_stopped(trace).get(rank) else None


_STOPPED: list[Any] = [None, {}]  # the last `proc` frame read and its answer (asked once per rank)


def watched_stopped(trace: Trace) -> dict[int, int]:
    """{rank: ns of the watcher's last look} for the ranks whose last look before their process was
    gone saw it stopped (state T or t), from the looks `diag watch` kept in the trace directory."""
    p = trace.frame(schema.PROC)
    if _STOPPED[0] is p:
        return dict(_STOPPED[1])
    out: dict[int, int] = {}
    if not p.empty and {"of_rank", "state", "ts"} <= set(p.columns):
        seen = p[~p["state"].astype(str).isin(("gone", "?", ""))]
        last = seen.sort_values("ts", kind="stable").groupby("of_rank").tail(1)
        out = {
            int(r): int(t)
            for r, st, t in zip(last["of_rank"], last["state"].astype(str), last["ts"])
            if st in ("T", "t")
        }
    _STOPPED[:] = [p, out]
    return dict(out)


def exit_of(trace: Trace, rank: int) -> int | None:
    """The wait status the live watcher read of `rank`'s dead process (while it was a zombie):
    the live look's, else the looks `diag watch` kept in the trace directory (`proc` records)."""
    fact = trace.headers.get(rank, {}).get("process")
    if isinstance(fact, dict) and fact.get("exit") is not None:
        return int(fact["exit"])
    p = trace.frame(schema.PROC)
    if p.empty or not {"of_rank", "exit"} <= set(p.columns):
        return None
    seen = pd.to_numeric(p.loc[p["of_rank"] == rank, "exit"], errors="coerce").dropna()
    return int(seen.iloc[-1]) if len(seen) else None


def last_record(trace: Trace) -> pd.Series:
    """Each rank's last record of any kind (ns): steps, comms, stats heartbeats, errors, memory,
    layers; over each kind's per-rank latest (`lasts.latest`: a max a window of steps can reduce
    and the windowed pass merge; the records of no step read whole)."""
    s = lasts.seen(lasts.latest(trace.frames))
    return s[s.index.map(lambda r: isinstance(r, int | float) and r >= 0)] if len(s) else s


def gone(trace: Trace) -> set[int]:
    """Ranks whose process the live watcher saw gone (exited, or a zombie) without their agent
    closing the trace: killed or crashed. Checked before any silence: under load a killed rank's
    missing records read as a lag or a divergence before its heartbeat is 3 beats late."""
    return {r for r in trace.headers if process_state(trace, r) == "gone"} - closed(trace)


def first_gone(trace: Trace) -> set[int]:
    """Of ranks all quiet now (every process gone, none closed: the launcher ended the survivors),
    those that died first: their records end >= 0.5 s before every other gone rank's (the
    survivors wrote on, failing in or waiting at the collective the dead rank left), else none."""
    dead = gone(trace)
    last = last_record(trace)
    last = last[last.index.map(lambda r: int(r) in dead)]
    if len(last) < 2:
        return set()
    cut = float(last.min()) + FIRST_BY_S * NS
    early = {int(r) for r, t in last.items() if t <= cut}
    return early if len(early) < len(last) else set()


def stopped_running(trace: Trace) -> dict[int, dict[str, Any]]:
    """Ranks whose process stopped running while a peer's went on: its heartbeat ended >= 3 beats
    before a peer's last record (not closed by its agent), or the watcher saw it gone / stopped.
    Each with how: {"how": "gone" | "stopped" | "silent", "silent_s": seconds behind the newest peer}."""
    last = last_record(trace)
    if len(last) < 2:
        return {}
    shut = closed(trace)
    out: dict[int, dict[str, Any]] = {}
    for rank, t in last.items():
        rank = int(rank)
        peers = last.drop(rank)
        behind = (float(peers.max()) - float(t)) / NS
        state = process_state(trace, rank)
        if state == "gone" and rank not in shut:
            out[rank] = {"how": "gone", "silent_s": max(behind, 0.0)}
        elif state in ("T", "t"):
            out[rank] = {"how": "stopped", "silent_s": max(behind, 0.0)}
        elif rank not in shut and behind >= SILENT_BEATS * HEARTBEAT_S and state not in ("R", "S", "D"):
            out[rank] = {"how": "silent", "silent_s": behind}
    alive = set(last.index.astype(int)) - set(out)
    return out if alive else {}  # every rank quiet: the job ended (or the whole host stopped)


def died(trace: Trace, rank: int, how: dict[str, Any]) -> bool:
    """A rank that stopped running is dead, not stopped: the watcher saw its process gone, or (a
    finished trace) its trace was never closed while a peer's agent closed its own after it (the
    peers' collectives failed on the dead connection and the job shut down)."""
    if how["how"] == "gone":
        return True
    if how["how"] != "silent":
        return False
    return bool(closed(trace) - {rank})


def entered(trace: Trace, metrics: Metrics) -> pd.DataFrame:
    """The rules' collectives (`metrics.comms`) with those each rank entered and has not completed
    yet: the agent's `comm_open` records (a call held >= 1.5 s) whose `comm` record is not written
    yet (same rank and issue time), with a null duration, as a never-completed call reads."""
    c = metrics.comms
    o = trace.frame(schema.COMM_OPEN)
    if o.empty:
        return c
    o = lasts.unmatched(c, comm_frame(o.assign(dur=None), metrics.steps))
    return pd.concat([c, o], ignore_index=True) if not o.empty else c


def killed_in_log(trace: Trace) -> set[int]:
    """Ranks the launcher's log reports ended by a signal (torchrun: `exitcode: -9`, SIGKILL)."""
    fail = trace.frame("log_failure")
    if fail.empty or "signal" not in fail.columns:
        return set()
    sig = fail["signal"].astype(object)
    hit = fail[sig.notna() & (sig.astype(str) != "") & (fail["exc"].astype(str) == "exit")]
    return {int(r) for r in hit["rank"] if r == r and int(r) >= 0}
