"""A failed job, from its log: what failed, on which rank, at which iteration, with the line itself.

The log importer (`diag.importers.logs.crash`) reads every sign of failure into `log_failure` and marks
the one its statement leads with (`first`): an OOM over an NCCL timeout over an exception over an
interrupt over a bare exit code, the earliest of that kind. This rule turns it into a finding, keeping
each rank's exit code from the launcher lines.

Without a log, the trace itself: the exception that ended a rank's main thread (the agent's `uncaught`
record, `diag.agent.uncaught`); else a rank whose process died (`liveness.died`: the live watcher saw
it gone, or its trace was never closed while a peer's agent closed its own after it), named with the
collective its peers were left in. Where both show and the first exception says a peer's connection
broke (`vocab.PEER_LOST`: a SIGKILLed rank leaves its peers raising "Connection reset by peer"), the
dead rank is the cause and the exceptions its consequences (the public DDP tutorial with one rank
SIGKILLed was "crashed: RuntimeError ... on rank 0", the survivor)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pandas as pd
from diag.analyzers import liveness
from diag.analyzers.base import rule

from diag import schema
from diag.findings import Finding, Fix
from diag.metrics.steps import NS
from diag.ranks import NO_RANK, rank_name, rank_names
from diag.vocab import PEER_LOST, STOP_SIGNALS, ended_by

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

_WHAT = {"oom": "CUDA out of memory", "nccl_timeout": "NCCL collective timeout", "interrupted": "interrupted"}
_PEER_LOST = re.compile(PEER_LOST, re.IGNORECASE)


def _val(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and v != v) else v


def _int(v: Any) -> int | None:
    v = _val(v)
    return None if v is None else int(v)


@rule("job_crash")
def job_crash(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a log shows the job failed (a traceback it did not survive, CUDA OOM, the NCCL watchdog,
    a launcher's non-zero exit code or signal), or, without a log, the trace records an exception
    that ended a rank, or a rank whose process died: critical. No threshold. A job whose only signs are a
    stop signal or an interrupt (SIGTERM / SIGINT / SIGHUP, KeyboardInterrupt, torchrun's
    SignalException) was stopped from outside: info. Fix: by failure kind (OOM:
    the framework's batch / recompute / parallelism settings; NCCL timeout: the desynced rank's stack)."""
    fail = trace.frame("log_failure")
    chosen = (
        fail[fail["first"].astype("boolean").fillna(False)]
        if not fail.empty and "first" in fail.columns
        else fail.iloc[:0]
    )
    if chosen.empty:
        raised = _uncaught(trace, metrics)
        if raised and _PEER_LOST.search(str(raised[0].evidence.get("message"))):
            dead = _dead_rank(trace, metrics) or _dead_rank(trace, metrics, _ended_before_raise(trace))
            if dead:
                return [_consequences(dead[0], raised[0])]
        return raised or _dead_rank(trace, metrics)
    chosen = chosen.assign(_t=pd.to_numeric(chosen["ts"], errors="coerce")).sort_values(["_t", "line"])
    first = chosen.iloc[0]
    exits = fail[fail["exc"].astype(str) == "exit"]
    codes = {
        int(r): int(c)
        for r, c in zip(exits["rank"], pd.to_numeric(exits["code"], errors="coerce"))
        if c == c and r >= 0
    }
    kind, rank, step = str(first["kind"]), int(first["rank"]), int(first["step"])
    if _stopped_from_outside(fail):
        return [_stopped(first, fail)]
    what = (
        f"process ended with {first['message']}"
        if first["exc"] == "exit"
        else _WHAT.get(kind, str(first["exc"]))
    )
    where = rank_name(rank) if rank != NO_RANK else "a rank the log does not name"
    # no progress line read: "step 0" is no step, so the finding names none
    known = bool(step) or _val(first.get("steps_known")) is None or bool(first.get("steps_known"))
    same = fail[(fail["kind"] == first["kind"]) & (fail["exc"] == first["exc"])]
    ev: dict[str, Any] = {
        "kind": kind,
        "exception": str(first["exc"]),
        "message": str(first["message"]),
        "first_rank": rank,
        "ranks": sorted({int(r) for r in same["rank"] if r >= 0}),
        "last_completed_step": step if known else None,
        "failed_iteration": step + 1 if known else None,
        "path": _val(first.get("path")),
        "line": int(first["line"]),
        "log_line": _val(first.get("text")),
        "exit_codes": codes,
        "signal": _val(first.get("signal")) or next((_val(s) for s in exits["signal"] if _val(s)), None),
    }
    if kind == "nccl_timeout":
        ev.update(seq=_int(first.get("seq")), op=_val(first.get("op")))
    fixes = [Fix(str(first["fix"]))] if _val(first.get("fix")) else []
    if kind == "nccl_timeout":
        timed = same[same["kind"] == "nccl_timeout"]
        desync = len({(_int(q), _val(o)) for q, o in zip(timed["seq"], timed["op"])}) > 1
        fixes.append(
            Fix(
                # every rank that reported waits in one collective: the one holding it is among those
                # that did not report (or the network)
                (
                    "look at the rank(s) on another sequence number"
                    if desync
                    else "look at the ranks that reported no timeout (one that never reached this"
                    " collective holds the others)"
                )
                + ": their stacks (py-spy dump / `diag stacks`) and Flight Recorder dumps say where they"
                " were",
                env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"},
            )
        )
    return [
        Finding(
            severity="critical",
            title=(
                f"job crashed at iteration {step + 1}: {what} on {where}"
                if step
                else f"job crashed before its first step: {what} on {where}"
                if known
                else f"job crashed: {what} on {where} (the log has no progress line diag reads)"
            ),
            detail=str(_val(first.get("statement")) or what),
            evidence=ev,
            ranks=sorted({int(r) for r in fail["rank"] if r >= 0}),
            steps=[step + 1] if known else [],
            fixes=fixes,
        )
    ]


def _stopped_from_outside(fail: pd.DataFrame) -> bool:
    """Every sign is an interruption or an exit by a stop signal (as `crash.stopped_from_outside`
    judges the log's failures, here on their frame)."""
    sig = (
        fail["signal"].astype(object) if "signal" in fail else pd.Series([None] * len(fail), index=fail.index)
    )
    kinds = fail["kind"].astype(str)
    return bool(((kinds == "interrupted") | ((kinds == "exit") & sig.isin(STOP_SIGNALS))).all())


def _stopped(first: pd.Series, fail: pd.DataFrame) -> Finding:
    step = int(first["step"])
    at = f"after iteration {step}" if step else "(the log names no completed iteration)"
    return Finding(
        severity="info",
        title=f"job stopped from outside {at}: {first['exc']} {str(first['message'])[:80]}".rstrip(),
        detail="the only signs of failure are a stop signal or an interrupt (Ctrl-C, scancel, a time "
        "limit, SIGTERM to the launcher): not a failure of the job itself",
        evidence={
            "kind": "interrupted",
            "exception": str(first["exc"]),
            "message": str(first["message"]),
            "last_completed_step": step,
            "line": int(first["line"]),
            "path": _val(first.get("path")),
        },
        ranks=sorted({int(r) for r in fail["rank"] if r >= 0}),
        steps=[step] if step else [],
    )


def _uncaught(trace: Trace, metrics: Metrics) -> list[Finding]:
    """The ranks whose main thread ended in an exception, the first one in time named (no log
    needed); only KeyboardInterrupts: the job was stopped from outside (info)."""
    meta = trace.frame(schema.META)
    rows = meta[meta["key"] == schema.META_UNCAUGHT].sort_values("ts") if not meta.empty else meta
    recs = [(int(r), v) for r, v in zip(rows.get("rank", []), rows.get("value", [])) if isinstance(v, dict)]
    if not recs:
        return []
    failed = [(r, v) for r, v in recs if not v.get("interrupted")]
    rank, first = (failed or recs)[0]
    st = metrics.steps
    done = st[st["rank"] == rank]["step"] if not st.empty else st
    last = int(done.max()) if len(done) else None
    ranks = sorted({r for r, _ in (failed or recs)})
    ev: dict[str, Any] = {
        "kind": "exception" if failed else "interrupted",
        "exception": str(first.get("exc")),
        "message": str(first.get("message") or ""),
        "where": first.get("where"),
        "job_frame": first.get("job_frame"),
        "first_rank": rank,
        "ranks": ranks,
        "last_completed_step": last,
        "source": "trace",
    }
    what = f"{first.get('exc')}: {first.get('message') or ''}".strip().rstrip(":")
    if not failed:
        at = f"after step {last}" if last is not None else "before its first step"
        return [
            Finding(
                severity="info",
                title=f"job stopped from outside {at}: {what}"[:160],
                detail="the only exception on record is an interrupt (Ctrl-C, SIGINT): the job was "
                "stopped, it did not fail by itself",
                evidence=ev,
                ranks=ranks,
                steps=[last] if last is not None else [],
            )
        ]
    who = rank_name(rank) + (f" (and {len(ranks) - 1} more)" if len(ranks) > 1 else "")
    at = f"at step {last + 1}" if last is not None else "before its first step"
    where, mine = first.get("where"), first.get("job_frame")
    called = f" (called from the job's {mine})" if mine and mine != where else ""
    return [
        Finding(
            severity="critical",
            title=f"job crashed {at}: {what} on {who}"[:200],
            detail=f"the main thread of {rank_names(ranks)} ended in an exception"
            + (f", raised at {where}{called}" if where else "")
            + (
                f". {rank_name(rank).capitalize()} raised first; the others' errors may be its consequences."
                if len(ranks) > 1
                else "."
            ),
            evidence=ev,
            ranks=ranks,
            steps=[last + 1] if last is not None else [],
            fixes=[
                Fix(
                    f"read {rank_name(rank)}'s traceback (its stderr)"
                    + (f": the job's own code at {mine} led to it" if mine else "")
                    + "; fix that error before looking at performance"
                )
            ],
        )
    ]


def _consequences(dead: Finding, raised: Finding) -> Finding:
    """The dead rank's finding, with the exceptions its death caused in its peers as evidence."""
    ev = raised.evidence
    what = f"{ev.get('exception')}: {ev.get('message')}"
    dead.detail += (
        f" Rank(s) {', '.join(map(str, ev.get('ranks') or []))} then raised {what[:160]}: a "
        "consequence (their connection to the dead rank broke), not the cause."
    )
    dead.evidence["consequences"] = {k: ev.get(k) for k in ("exception", "message", "ranks", "where")}
    return dead


def _ended_before_raise(trace: Trace) -> dict[int, dict[str, Any]]:
    """The ranks that raised nothing whose records end before the first exception was raised (a
    peer-lost one): the ranks whose death it reports, when every rank's records end within moments
    (the survivors were ended by the launcher, no trace closed)."""
    meta = trace.frame(schema.META)
    rows = meta[meta["key"] == schema.META_UNCAUGHT] if not meta.empty else meta
    if rows.empty:
        return {}
    first = float(pd.to_numeric(rows["ts"], errors="coerce").min())
    raised = {int(r) for r in rows["rank"]}
    return {
        int(r): {"how": "ended", "silent_s": (first - float(t)) / NS}
        for r, t in liveness.last_record(trace).items()
        if int(r) not in raised and float(t) <= first
    }


def _dead_rank(
    trace: Trace, metrics: Metrics, down: dict[int, dict[str, Any]] | None = None
) -> list[Finding]:
    """A rank's process died while its peers ran on (no log needed): `liveness.died`; or, every
    process gone now (the launcher ended the survivors), the ranks whose records ended first; or the
    ranks `down` names."""
    if down is not None:
        dead = sorted(down)
    else:
        down = liveness.stopped_running(trace)
        dead = sorted(r for r, v in down.items() if liveness.died(trace, r, v))
    if not down:  # every rank quiet: each process gone, those whose records end first died first
        last = liveness.last_record(trace)
        dead = sorted(liveness.first_gone(trace))
        down = {r: {"how": "gone", "silent_s": (float(last.max()) - float(last[r])) / NS} for r in dead}
    if not dead:
        return []
    st, pending = metrics.steps, metrics.lasts.pending  # the calls never completed (few)
    step = {r: int(st[st["rank"] == r]["step"].max()) for r in dead if (st["rank"] == r).any()}
    peers = [int(r) for r in liveness.last_record(trace).index if int(r) not in dead]
    left = pending[pending["rank"].isin(peers)]
    ran_on = st[st["rank"].isin(peers)]["step"] if not st.empty else st
    peer_step = int(ran_on.max()) if len(ran_on) else None
    where = ""
    ev: dict[str, Any] = {
        "dead_ranks": dead,
        "peers_last_completed_step": peer_step,
        "how": {r: down[r]["how"] for r in dead},
        "last_completed_step": step,
        "silent_s": {r: round(down[r]["silent_s"], 3) for r in dead},
    }
    if not left.empty:
        row = left.sort_values("ts", kind="stable").iloc[-1]
        ev.update(group=str(row["group"]), collective=str(row["kind"]), step=int(row["step"]))
        where = f"; {rank_name(row['rank'])} was left in {row['kind']} (group {row['group']}"
        where += f", step {ev['step']})"
    ended = {r: ended_by(x) for r in dead if (x := liveness.exit_of(trace, r)) is not None}
    if ended:
        ev["ended_by"] = ended
    by = set(ended.values())
    # the watcher read the dead processes' wait status: named, not guessed
    cause = next(iter(by)) if len(ended) == len(dead) and len(by) == 1 else None
    hows = {down[r]["how"] for r in dead}
    seen = (
        "its process is gone"
        if hows == {"gone"}
        else "its records end before a peer raised that its connection broke, and it raised nothing"
        if hows == {"ended"}
        else "its trace ends without the agent's close while its peers closed theirs after it"
    )
    who = rank_names(dead)
    return [
        Finding(
            severity="critical",
            title=f"job crashed: {who} died"
            + (f" ({cause})" if cause else "")
            + (f" after step {step[dead[0]]}" if dead[0] in step else "")
            + (  # a killed rank's last flush (up to 0.5 s of records) is lost with it
                f" (its last record; its peers completed step {peer_step})"
                if dead[0] in step and peer_step is not None and peer_step > step[dead[0]]
                else ""
            )
            + where,
            detail=f"{who}: {seen}"
            + (
                f", {'killed by' if cause.startswith('SIG') else 'ended with'} {cause}"
                if cause
                else " (killed: SIGKILL, the OOM killer, a segfault)"
            )
            + ". Its peers' collectives then wait for it or fail.",
            evidence=ev,
            ranks=dead,
            steps=sorted({s + 1 for s in step.values()}),
            fixes=[
                Fix(
                    "read the dead rank's stderr and the host's kernel log (dmesg: the OOM killer, a "
                    "segfault) for why it died; torchrun's summary names its exit code or signal"
                )
            ],
        )
    ]
