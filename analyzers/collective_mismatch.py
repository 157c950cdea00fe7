"""A desync from diag's own collective records (no Flight Recorder needed): in one process group, the
ranks' k-th collective of a step differs in op or size, i.e. one rank took a rank-dependent branch
around a collective. On NCCL and gloo the calls then never match: the group hangs in them (or, with
sizes that happen to fit, reduces garbage), and the timeout, if any, names neither rank nor call.

Collectives are aligned per (group, step, k-th of that step in that group, in issue order), so ranks
that attached at different moments still line up (each rank's first recorded step is left out: it
may be partial, even when numbered 0: an FSDP2 job attached within its first optimizer step read as
"rank 1: all_gather; rank 0: reduce_scatter" at step 0). In a live trace a record whose duration is
still unknown is held back by the agent for up to 10 s while later ones are written, so only
records that are final are compared: older than the rank's latest record by that hold, or up to a
call that never completed (a null duration: given up on, or announced by the agent as entered and
still waited in after 1.5 s, `liveness.entered`: a desync is named seconds after it, not 10 s).
Point-to-point ops are left out (their peers differ by rank), and all-to-all sizes (uneven splits
are normal)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from diag.analyzers import liveness
from diag.analyzers.base import rule

from diag.findings import Finding, Fix
from diag.metrics.positions import within_runs
from diag.metrics.steps import NS
from diag.metrics.text import as_text
from diag.vocab import P2P

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

HOLD_S = 10.0  # the agent's longest hold of a record whose duration is pending (agent.pending.MAX_HOLD_S)
ANY_SIZE = ("all_to_all",)  # ops whose per-rank sizes differ in a healthy job


def _final(trace: Trace, c: pd.DataFrame) -> pd.DataFrame:
    """The records no held-back record can precede any more (all of them in a finished trace)."""
    if not liveness.live(trace):
        return c
    last = liveness.last_record(trace)
    stuck = c[pd.to_numeric(c["dur"], errors="coerce").isna()].groupby("rank")["ts"].max()
    bound = {r: max(float(last.get(r, 0)) - HOLD_S * NS, float(stuck.get(r, 0))) for r in c["rank"].unique()}
    return c[c["ts"].astype(float) <= c["rank"].map(bound)]


def _aligned(c: pd.DataFrame) -> pd.DataFrame:
    """Each record's position: its group, step and index among that rank's calls in them (`k`)."""
    first = c.groupby("rank")["step"].min()  # a trace may begin mid-step (attach), whatever its number
    c = c[(c["step"] > c["rank"].map(first)).to_numpy()]
    return c.assign(k=_position(c))


def _position(c: pd.DataFrame) -> np.ndarray:
    """Each call's index among its rank's calls in its group and step, in issue (ts) order: what
    `groupby([group, step, rank]).cumcount()` of the calls sorted by ts gives, from a few integer
    arrays instead of a sorted copy of the frame (a copy and the groupby's keys were this rule's
    peak: +112 MiB for 843,360 calls)."""
    n = len(c)
    issued = np.empty(n, np.int64)
    issued[np.argsort(c["ts"].to_numpy(), kind="stable")] = np.arange(n)
    keys = (pd.factorize(c["group"])[0], c["step"].to_numpy(), c["rank"].to_numpy())
    order = np.lexsort((issued, *reversed(keys)))
    del issued
    return within_runs(order, keys)


def _sig(row: Any) -> tuple[str, int | None]:
    nbytes = row["bytes"]
    size = None if row["kind"] in ANY_SIZE or nbytes != nbytes or nbytes is None else int(nbytes)
    return (str(row["kind"]), size)


def _culprits(at: pd.DataFrame, c: pd.DataFrame) -> tuple[list[int], tuple[str, int | None]]:
    """The ranks whose call differs and the call the others made: a strict majority's; between equal
    camps, the call the group made at this position in earlier steps (the ranks that left it)."""
    sigs = {int(r): _sig(row) for r, row in at.set_index("rank").iterrows()}
    camps: dict[tuple[str, int | None], list[int]] = {}
    for r, s in sigs.items():
        camps.setdefault(s, []).append(r)
    big = max(camps.values(), key=len)
    if sum(len(v) == len(big) for v in camps.values()) == 1:
        usual = next(s for s, v in camps.items() if v is big)
    else:
        step, k, group = int(at["step"].iloc[0]), int(at["k"].iloc[0]), at["group"].iloc[0]
        before = c[(c["group"] == group) & (c["k"] == k) & (c["step"] < step)]
        seen = {_sig(row) for _, row in before.iterrows()}
        known = [s for s in camps if s in seen]
        if len(known) != 1:
            return sorted(sigs), ("", None)  # no way to tell which side left the usual call
        usual = known[0]
    return sorted(r for r, s in sigs.items() if s != usual), usual


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n} B"


@rule("collective_mismatch")
def collective_mismatch(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires (critical) when, in one process group, every member recorded its k-th collective of a step
    and they differ in op or byte size (diag's own records, final ones only in a live trace; not p2p,
    not all-to-all sizes). Names the ranks outside a strict majority, or, between equal camps, the
    ranks that left the call the group made at that position in earlier steps (all members when
    that cannot be told), with the group, step and each rank's call. Fix: the named ranks' code path
    around that call (a rank-dependent branch, a data-dependent shape). Live, a record is compared once
    final: 10 s older than its rank's latest record (the agent's hold), or up to a call never
    completed (given up on, or still waited in after 1.5 s)."""
    c = liveness.entered(trace, metrics)
    if c.empty or "group" not in c or "step" not in c:
        return []
    # the columns read, first: each filter below copies what it keeps (a 64-rank trace's 3.4 M calls)
    c = c[[col for col in ("rank", "group", "step", "ts", "dur", "kind", "bytes") if col in c]]
    c = c[~c["kind"].isin(P2P).to_numpy() & c["step"].notna().to_numpy() & c["ts"].notna().to_numpy()]
    c = c.assign(group=as_text(c["group"]), step=pd.to_numeric(c["step"]).astype(int))
    c = _aligned(_final(trace, c))
    out = []
    for group, step, k in _first_differing(c):
        g = c[c["group"] == group]
        at = g[(g["step"] == step) & (g["k"] == k)].sort_values("ts", kind="stable")  # in issue order
        out.append(_finding(str(group), step, k, at, g))
    return out


def _first_differing(c: pd.DataFrame) -> list[tuple[str, int, int]]:
    """Per group, the first (step, k) that every member recorded and whose calls differ (`_sig`),
    found with whole-column operations: a live job of fast steps has hundreds of thousands of
    positions, and one Python step per position took 5.7 s a look in `diag watch`. On integer
    arrays sorted once (a groupby's nunique of the frame took +113 MiB for 843,360 calls)."""
    if c.empty:
        return []
    nbytes = pd.to_numeric(c["bytes"], errors="coerce").where(~c["kind"].isin(ANY_SIZE))
    size = pd.factorize(nbytes.fillna(-1).round().astype("int64"))[0]  # -1: None
    kind = pd.factorize(c["kind"])[0]
    # one integer per distinct (op, size), -1 for a call of no op (not counted among the
    # signatures, as a groupby's NaN key is not): strings of them took 200 MB for 3.4 M calls
    sig = np.where(kind < 0, -1, kind.astype(np.int64) * (int(size.max()) + 1) + size)
    group, names = pd.factorize(c["group"], sort=True)  # missing: -1, in no group
    rank = pd.factorize(c["rank"])[0]
    step, k = c["step"].to_numpy(np.int64), c["k"].to_numpy(np.int64)
    keep = group >= 0
    if not keep.all():  # (a copy of each array: only where some call has no group)
        group, rank, step, k, sig = group[keep], rank[keep], step[keep], k[keep], sig[keep]
    if not len(group):
        return []
    # members per group: distinct (group, rank) pairs
    pairs = np.unique(group.astype(np.int64) * (int(rank.max()) + 1) + rank)
    members = np.bincount(pairs // (int(rank.max()) + 1), minlength=len(names))
    order = np.lexsort((sig, k, step, group))
    group, step, k, sig = group[order], step[order], k[order], sig[order]
    del order
    new = np.ones(len(group), dtype=bool)
    new[1:] = (group[1:] != group[:-1]) | (step[1:] != step[:-1]) | (k[1:] != k[:-1])
    starts = np.flatnonzero(new)
    # a rank has one call at a position: calls there = ranks there; distinct sigs = 1 + changes
    ranks = np.diff(np.append(starts, len(group)))
    changed = np.zeros(len(group), dtype=np.int64)
    changed[1:] = (sig[1:] != sig[:-1]) & ~new[1:]
    sigs = 1 + np.add.reduceat(changed, starts) - (sig[starts] < 0)  # a call of no op: no signature
    g = group[starts]
    odd = (ranks == members[g]) & (sigs > 1) & (ranks >= 2)
    out = []
    seen: set[int] = set()
    for i in np.flatnonzero(odd):  # sorted by group, step, k: each group's first is its first here
        if g[i] not in seen:
            seen.add(int(g[i]))
            out.append((str(names[g[i]]), int(step[starts[i]]), int(k[starts[i]])))
    return out


def _finding(group: str, step: int, k: int, at: pd.DataFrame, g: pd.DataFrame) -> Finding:
    ranks, usual = _culprits(at, g)
    calls = {
        int(r): {"op": op, "bytes": n}
        for r, (op, n) in ((r, _sig(row)) for r, row in at.set_index("rank").iterrows())
    }
    odd = calls[ranks[0]]
    others = sorted(set(calls) - set(ranks))
    said = (
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} called {odd['op']} "
        f"({_size(odd['bytes'])}) where rank{'s' if len(others) > 1 else ''} "
        f"{', '.join(map(str, others))} called {usual[0]} ({_size(usual[1])})"
        if others
        else "ranks called "
        + "; ".join(f"rank {r}: {v['op']} ({_size(v['bytes'])})" for r, v in calls.items())
    )
    return Finding(
        severity="critical",
        title=f"collective mismatch in group {group} at step {step}: {said}",
        detail=(
            f"call #{k + 1} of step {step} in group {group} differs between ranks: the calls cannot "
            "match, so the group hangs in them (or reduces mismatched buffers)"
        ),
        evidence={
            "group": group,
            "step": step,
            "index_in_step": k,
            "collective": odd["op"],
            "calls": calls,
            "expected": {"op": usual[0], "bytes": usual[1]} if others else None,
        },
        ranks=ranks,
        steps=[step],
        fixes=[
            Fix(
                f"look at rank {ranks[0]}'s code path at step {step} (`diag stacks`, py-spy dump): a "
                "rank-dependent branch around a collective, or a data-dependent tensor shape",
                env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
            )
        ],
    )
