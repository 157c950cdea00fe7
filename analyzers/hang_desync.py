"""Hang / desync: ranks disagree on their last collective, or a rank stopped emitting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
from diag.analyzers import evidence, liveness
from diag.analyzers.base import rule

from diag import schema
from diag.findings import Finding, Fix
from diag.metrics.lasts import Tails
from diag.metrics.steps import NS

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

SILENT_S = 60.0  # a rank silent this long while the others went on ...
SILENT_STEPS = 20  # ... or this many median steps, whichever is longer
STEP_LAG = 2  # a rank this many steps behind the furthest one
STALL_S = 2.0  # peers without a completed step this long (and STALL_STEPS median steps) ...
STALL_STEPS = 5  # ... while a rank's process is stopped: a hang, not a pause of a duty cycle
STALL_CAP_S = 6.0  # ... at most this long when the waiting ranks are in a call entered since their
# last step ended and never completed (a duty cycle's pauses never hold a call 1.5 s): FSDP2's 2-3 s
# steps made a SIGSTOPped rank's hang 14-20 s late


def last_seen(metrics: Metrics) -> pd.Series:
    """Each rank's last event timestamp (ns) over steps and comms (`Metrics.lasts`: per kind each
    rank's greatest)."""
    return metrics.lasts.seen((schema.STEP, schema.COMM)).astype("int64")


def _size(nbytes: Any) -> int | None:
    """A collective's size, None when unknown (NaN / None), never 0."""
    return None if nbytes is None or nbytes != nbytes else int(nbytes)


def last_collectives(lasts: Tails) -> dict[str, dict[int, dict[str, Any]]]:
    """Per group: each member rank's count of collectives and its last one (op, bytes, step)
    (`Tails.groups`: a groupby of every call by group and rank was this rule's peak after
    `metrics.comms`)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    g = lasts.groups
    cols = (g[col] for col in ("group", "rank", "count", "kind", "bytes", "step"))
    for group, rank, n, op, size, at in zip(*cols):
        out.setdefault(group, {})[int(rank)] = {
            "count": int(n),
            "op": op,
            "bytes": _size(size),
            "step": int(at),
        }
    return out


def detached(trace: Trace) -> set[int]:
    """Ranks whose trace ended with diag stopping while the job ran on (a detach; the comms collector
    writes how many ops were then in flight): its last collectives are where diag stopped looking."""
    return {r for r, h in trace.headers.items() if schema.META_UNFINISHED_AT_DETACH in h}


def _behind_when_detached(steps: pd.DataFrame, rank: int, at: int) -> bool:
    """A detached rank `STEP_LAG` steps or more behind the furthest step the others had ended by
    its last record (`at`, ns)."""
    ends = pd.to_numeric(steps["ts"], errors="coerce") + pd.to_numeric(steps["dur"], errors="coerce")
    others = steps.loc[(steps["rank"] != rank) & (ends <= at), "step"]
    mine = steps.loc[steps["rank"] == rank, "step"]
    return not others.empty and not mine.empty and others.max() - mine.max() >= STEP_LAG


def _diverged(lasts: Tails, stopped_looking: set[int]) -> dict[str, dict[int, dict[str, Any]]]:
    """Groups whose members completed different numbers of collectives and ended in different ones;
    not a group whose every member was detached (each at its own moment: counts are not comparable)."""
    bad = {}
    for group, ranks in last_collectives(lasts).items():
        if set(ranks) <= stopped_looking:
            continue
        counts = {v["count"] for v in ranks.values()}
        lasts = {(v["op"], v["bytes"]) for v in ranks.values()}
        if len(ranks) > 1 and len(counts) > 1 and len(lasts) > 1:
            bad[group] = ranks
    return bad


def still_moving(trace: Trace, lasts: Tails, median_step_s: float) -> bool:
    """A running job whose ranks still complete collectives: the newest one ended less than max(2 s,
    5 median steps) before the earliest of the ranks' last records. Its ranks' counts differ at any
    moment (each writes every 0.5 s; a throttled rank, stopped 40 ms of every 100 ms, issues each
    collective later than its peer, which waits in it): a ZeRO-2 job read so looked desynced, ranks
    [0, 1]. A real desync stops them: both wait in different collectives while heartbeats go on."""
    last = liveness.last_record(trace)
    if not lasts.calls or last.empty:
        return False
    quiet_s = (float(last.min()) - lasts.latest_end) / NS
    return quiet_s < max(STALL_S, STALL_STEPS * median_step_s)


def beating(trace: Trace) -> bool:
    """Every rank's agent wrote heartbeats (diag's own trace, stats every 2 s until its process
    stopped): where its records end, its process stopped, whatever was left unflushed."""
    st = trace.frame(schema.STATS)
    return not st.empty and set(trace.ranks) <= set(st["rank"].astype(int))


def quiet_s(metrics: Metrics) -> float:
    """How long peers must have made no progress for a lag or a divergence to be a hang, not the
    agent's unflushed last 0.5 s of a job killed all at once: max(2 s, 5 median steps)."""
    return max(STALL_S, STALL_STEPS * metrics.median_step_s)


def _where_stuck(trace: Trace, metrics: Metrics, waiting: list[int], frozen: list[int]) -> dict[str, Any]:
    """The collective the waiting ranks are stuck in: their pending one (issued, never completed, or
    still waited in after 1.5 s) when the agent wrote it, else the one after their last completed
    (its step: no earlier than the one after the rank's last ended step: DDP's bucket all-reduce is
    its step's last collective, and a hang read as that step, one below the iteration the program
    was in); with each rank's count of completed collectives in that group (the frozen ranks'
    lower count: never arrived)."""
    lasts = metrics.lasts  # each rank's last call and its pending ones (`liveness.entered`'s)
    pend = lasts.entered(waiting)
    mine = lasts.last[lasts.last["rank"].isin(waiting)]
    if mine.empty and pend.empty:
        return {}
    last = (pend if not pend.empty else mine).sort_values("ts", kind="stable")  # ties: the frame's order
    row = last.iloc[-1]
    group, step = str(row["group"]), int(row["step"])
    if pend.empty:
        st = metrics.steps
        ended = st[st["rank"] == row["rank"]]["step"]
        step = max(step, int(ended.max()) + 1) if not ended.empty else step
    g = lasts.groups
    done = g[(g["group"] == group) & (g["done"] > 0)]
    counts = {int(r): int(n) for r, n in zip(done["rank"], done["done"])}
    return {
        "group": group,
        "collective": str(row["kind"]),
        "pending": not pend.empty,
        "step": step,
        "completed_in_group": counts,
        "issued_ns": float(row["ts"]),
    }


def _frozen(trace: Trace, metrics: Metrics, frozen: dict[int, dict[str, Any]]) -> Finding | None:
    """Ranks whose process stopped running (stopped, or its heartbeat ended) while the other ranks,
    still running, have completed no step for >= max(2 s, 5 median steps), or max(2 s, min(5 median
    steps, 6 s)) when they wait in a call entered after their last step and never completed: a
    hang, with the ranks that never arrived named."""
    st = metrics.steps
    last = liveness.last_record(trace)
    waiting = [int(r) for r in last.index if int(r) not in frozen]
    if not frozen or not waiting or st.empty:
        return None
    facts = [h["process"]["checked_ns"] for h in trace.headers.values() if isinstance(h.get("process"), dict)]
    facts += liveness.watched_stopped(trace).values()  # after the job: the watcher's last looks
    now = max([float(last.max()), *map(float, facts)])
    peer_end = float(st[st["rank"].isin(waiting)]["end"].max()) if st["rank"].isin(waiting).any() else None
    stall_s = (now - peer_end) / NS if peer_end is not None else 0.0
    max_step = st.groupby("rank")["step"].max()
    # (how far the others got is no premise: a stopped rank's last 0.5 s of records were never written)
    where = _where_stuck(trace, metrics, waiting, sorted(frozen))
    issued = where.pop("issued_ns", None)
    need = max(STALL_S, STALL_STEPS * metrics.median_step_s)
    if where.get("pending") and issued is not None and peer_end is not None and issued >= peer_end:
        need = max(STALL_S, min(need, STALL_CAP_S))  # the others wait in a call of their current step
    if stall_s < need:
        return None
    ranks = sorted(frozen)
    how = {"stopped": "its process is stopped", "silent": "its process stopped writing (heartbeat)"}
    whys = "; ".join(f"rank {r}: {how.get(v['how'], v['how'])}" for r, v in sorted(frozen.items()))
    coll = (
        f"{where['collective']} in group {where['group']} at step {where['step']}"
        + ("" if where.get("pending") else " (the one after their last completed)")
        if where
        else "their next collective"
    )
    return Finding(
        severity="critical",
        title=f"hang: ranks {waiting} wait in {coll}; never arrived: rank{'s' if len(ranks) > 1 else ''} "
        + ", ".join(map(str, ranks)),
        detail=(
            f"{whys}. The other ranks have completed no step for {stall_s:.1f} s "
            f"({stall_s / max(metrics.median_step_s, 1e-9):.0f} median steps)."
        ),
        evidence={
            **where,
            "waiting": waiting,
            "never_arrived": ranks,
            "how": {r: v["how"] for r, v in frozen.items()},
            "stalled_s": stall_s,
            "max_step": evidence.by_rank(max_step, int),
        },
        ranks=ranks,
        steps=[where["step"]] if where else [],
        fixes=[
            Fix(
                f"look at rank {ranks[0]}'s process (`diag stacks`, py-spy dump): stopped (SIGSTOP, a "
                "debugger), swapping, or its host frozen; resume or restart it",
                env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
            )
        ],
    )


@rule("hang_desync")
def hang_desync(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a rank's process stopped running (the live watcher saw it stopped, also read after
    the job from its looks kept in the trace directory, or its agent's
    heartbeat ended >= 3 beats of 2 s before a peer's last record) while the other ranks have
    completed no step for >= max(2 s, 5 median steps), at most 6 s when they wait in a call
    entered since their last step and never completed: a hang, naming the rank that never arrived
    and the collective the others wait in (their pending one, or the one after their last
    completed). Also when ranks of one group completed different numbers of collectives and their
    last ones differ (op or size: a desync; unless every member's trace ended by a detach, each at
    its own moment, with ops in flight then recorded as unfinished, not as evidence; in a running
    job, or in a diag trace with every rank's heartbeats, once no collective completed for max(2 s,
    5 median steps)), when a rank is >= 2 steps behind the furthest (not in a running job: between
    two 0.5 s flushes a fast job's ranks look steps apart; a stopped rank is the first premise; a
    rank whose trace a detach ended, each rank at its own moment: only behind the steps the others
    had ended by its last record, and never silent since; in a
    diag trace with heartbeats, only if the others' processes went on that long after it: a job
    killed all at once loses each rank's last flush, a different number of steps each), or when a
    rank went silent >= max(60 s, 20 median steps) before the others' last event. Not when a rank
    died (its process gone without its agent's close: checked first, since under load a killed
    rank's lost last records read as a divergence before they read as silence; or the launcher's
    log says a signal ended it): the others wait for it or diverge because of it, and job_crash
    names it. Fix: run `diag stacks` / py-spy dump on the
    ranks named, look for a rank-dependent branch around a collective; NCCL_ASYNC_ERROR_HANDLING /
    TORCH_NCCL_ASYNC_ERROR_HANDLING turn a hang into an error with the op named."""
    down = liveness.stopped_running(trace)
    dead = {r for r, v in down.items() if liveness.died(trace, r, v)} | liveness.killed_in_log(trace)
    if dead or liveness.gone(trace):
        return []  # a rank died: the others wait for it or diverge because of it (job_crash names it)
    hung = _frozen(trace, metrics, {r: v for r, v in down.items() if r not in dead})
    if hung is not None:
        return [hung]
    seen = last_seen(metrics)
    if len(seen) < 2:
        return []
    silent_ns = max(SILENT_S, SILENT_STEPS * metrics.median_step_s) * NS
    stopped = [int(r) for r, t in seen.items() if seen.max() - t >= silent_ns]
    st = trace.steps
    max_step = st.groupby("rank")["step"].max() if not st.empty else pd.Series(dtype=int)
    behind = [int(r) for r, s in max_step.items() if max_step.max() - s >= STEP_LAG]
    # a rank whose trace a detach ended (each rank at its own moment) was last seen where diag
    # stopped looking: silent since, and behind only the steps the others ended after it
    let_go = {r: int(seen[r]) for r in detached(trace) if r in seen.index}
    stopped = [r for r in stopped if r not in let_go]
    behind = [r for r in behind if r not in let_go or _behind_when_detached(st, r, let_go[r])]
    if liveness.live(trace):
        # a running job: each rank writes its records every 0.5 s, so a fast job's ranks look steps
        # apart between two flushes; a rank that stopped running is the premise above (_frozen)
        behind = []
    elif behind and beating(trace):
        # a job killed all at once (SIGTERM, scancel) loses each rank's last flush, a different
        # number of steps each: behind only if the others' processes went on, quiet, after it
        others_end = liveness.last_record(trace)
        behind = [
            r
            for r in behind
            if float(others_end.drop(r, errors="ignore").max()) - float(seen.get(r, 0))
            >= quiet_s(metrics) * NS
        ]
    lasts = metrics.lasts
    settled = liveness.live(trace) or beating(trace)  # records end where processes stopped
    moving = settled and still_moving(trace, lasts, metrics.median_step_s)
    diverged = _diverged(lasts, detached(trace)) if lasts.calls and not moving else {}
    if not (stopped or behind or diverged):
        return []
    ranks = sorted(set(stopped) | set(behind) | {r for g in diverged.values() for r in g})
    what = (
        "ranks stopped emitting"
        if stopped
        else "ranks diverged in their collectives"
        if diverged
        else "ranks fell behind"
    )
    return [
        Finding(
            severity="critical",
            title=f"hang or desync: {what} ({ranks})",
            detail="ranks disagree on where they are: a hang, a crash, or a rank-dependent collective",
            evidence={
                "last_seen_s_before_end": {int(r): (seen.max() - t) / NS for r, t in seen.items()},
                "max_step": evidence.by_rank(max_step, int),
                "stopped": stopped,
                "behind": behind,
                "diverged_groups": diverged,
            },
            ranks=ranks,
            steps=sorted({int(s) for s in max_step.values}),
            fixes=[
                Fix(
                    "surface the hung op as an error and dump every rank's stack (`diag attach`, py-spy)",
                    env={
                        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                        "NCCL_DEBUG": "INFO",
                        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
                    },
                )
            ],
        )
    ]
