"""Hang / desync: ranks disagree on their last collective, or a rank stopped emitting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
from diag.analyzers import evidence
from diag.analyzers.base import rule

from diag import schema
from diag.findings import Finding, Fix
from diag.metrics.steps import NS

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

SILENT_S = 60.0  # a rank silent this long while the others went on ...
SILENT_STEPS = 20  # ... or this many median steps, whichever is longer
STEP_LAG = 2  # a rank this many steps behind the furthest one


def last_seen(trace: Trace) -> pd.Series:
    """Each rank's last event timestamp (ns) over steps and comms."""
    parts = [df.groupby("rank")["ts"].max() for df in (trace.steps, trace.comms) if not df.empty]
    if not parts:
        return pd.Series(dtype="int64")
    return pd.concat(parts, axis=1).max(axis=1).astype("int64")


def _size(nbytes: Any) -> int | None:
    """A collective's size, None when unknown (NaN / None), never 0."""
    return None if nbytes is None or nbytes != nbytes else int(nbytes)


def last_collectives(c: pd.DataFrame) -> dict[str, dict[int, dict[str, Any]]]:
    """Per group: each member rank's count of collectives and its last one (op, bytes, step)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    by = c.groupby([c["group"].astype(str), "rank"], observed=True)
    counts, last = by.size(), c.loc[by["ts"].idxmax()]
    for (group, rank), n, op, nbytes, step in zip(
        counts.index, counts, last["kind"], last["bytes"], last["step"]
    ):
        out.setdefault(group, {})[int(rank)] = {
            "count": int(n),
            "op": op,
            "bytes": _size(nbytes),
            "step": int(step),
        }
    return out


def detached(trace: Trace) -> set[int]:
    """Ranks whose trace ended with diag stopping while the job ran on (a detach; the comms collector
    writes how many ops were then in flight): its last collectives are where diag stopped looking."""
    return {r for r, h in trace.headers.items() if schema.META_UNFINISHED_AT_DETACH in h}


def _diverged(c: pd.DataFrame, stopped_looking: set[int]) -> dict[str, dict[int, dict[str, Any]]]:
    """Groups whose members completed different numbers of collectives and ended in different ones;
    not a group whose every member was detached (each at its own moment: counts are not comparable)."""
    bad = {}
    for group, ranks in last_collectives(c).items():
        if set(ranks) <= stopped_looking:
            continue
        counts = {v["count"] for v in ranks.values()}
        lasts = {(v["op"], v["bytes"]) for v in ranks.values()}
        if len(ranks) > 1 and len(counts) > 1 and len(lasts) > 1:
            bad[group] = ranks
    return bad


@rule("hang_desync")
def hang_desync(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when ranks of one group completed different numbers of collectives and their last ones
    differ (op or size: a desync; unless every member's trace ended by a detach, each at its own
    moment, with ops in flight then recorded as unfinished, not as evidence), when a rank is >= 2
    steps behind the furthest, or when a rank went silent >= max(60 s, 20 median steps) before the
    others' last event (stopped emitting: hung or dead). Fix: run `diag attach` / py-spy dump on the
    ranks named, look for a rank-dependent branch around a collective; NCCL_ASYNC_ERROR_HANDLING /
    TORCH_NCCL_ASYNC_ERROR_HANDLING turn a hang into an error with the op named."""
    seen = last_seen(trace)
    if len(seen) < 2:
        return []
    silent_ns = max(SILENT_S, SILENT_STEPS * metrics.median_step_s) * NS
    stopped = [int(r) for r, t in seen.items() if seen.max() - t >= silent_ns]
    st = trace.steps
    max_step = st.groupby("rank")["step"].max() if not st.empty else pd.Series(dtype=int)
    behind = [int(r) for r, s in max_step.items() if max_step.max() - s >= STEP_LAG]
    diverged = _diverged(metrics.comms, detached(trace)) if not trace.comms.empty else {}
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
