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

import pandas as pd
from diag.analyzers import liveness
from diag.analyzers.base import rule

from diag.findings import Finding, Fix
from diag.metrics.steps import NS
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
    """Each record's position: its group, step and index among that rank's calls in them."""
    first = c.groupby("rank")["step"].min()  # a trace may begin mid-step (attach), whatever its number
    c = c[(c["step"] > c["rank"].map(first)).to_numpy()]  # before sorting: one copy fewer of the rest
    c = c.sort_values("ts", kind="stable")
    return c.assign(k=c.groupby(["group", "step", "rank"]).cumcount())


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
    c = c.assign(group=c["group"].astype(str), step=pd.to_numeric(c["step"]).astype(int))
    c = _aligned(_final(trace, c))
    out = []
    for group, step, k in _first_differing(c):
        g = c[c["group"] == group]
        at = g[(g["step"] == step) & (g["k"] == k)]
        out.append(_finding(str(group), step, k, at, g))
    return out


def _first_differing(c: pd.DataFrame) -> list[tuple[str, int, int]]:
    """Per group, the first (step, k) that every member recorded and whose calls differ (`_sig`),
    found with whole-column operations: a live job of fast steps has hundreds of thousands of
    positions, and one Python step per position took 5.7 s a look in `diag watch`."""
    if c.empty:
        return []
    nbytes = pd.to_numeric(c["bytes"], errors="coerce").where(~c["kind"].isin(ANY_SIZE))
    size = nbytes.fillna(-1).round().astype("int64")  # -1: None
    # one integer per distinct (op, size): strings of them took 200 MB for 3.4 M calls
    sig = pd.DataFrame({"kind": c["kind"].astype(str), "size": size}).groupby(["kind", "size"]).ngroup()
    c = pd.DataFrame({"group": c["group"], "step": c["step"], "k": c["k"], "rank": c["rank"], "sig": sig})
    members = c.groupby("group")["rank"].nunique()
    at = c.groupby(["group", "step", "k"], sort=True).agg(ranks=("rank", "nunique"), sigs=("sig", "nunique"))
    full = at["ranks"].to_numpy() == members.reindex(at.index.get_level_values("group")).to_numpy()
    odd = at[full & (at["sigs"].to_numpy() > 1) & (at["ranks"].to_numpy() >= 2)]
    firsts = odd.reset_index().groupby("group", sort=True).first()
    return [(str(g), int(row["step"]), int(row["k"])) for g, row in firsts.iterrows()]


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
