"""A hang diagnosed from PyTorch Flight Recorder dumps: which rank is behind, on which collective, and
which ranks called a different collective than their group (what torch's fr_trace calls a mismatch).

Per process group (the dumps' `process_group` name), over the collectives (`is_p2p` false) each rank
recorded: its last sequence number (`collective_seq_id`). A rank whose last number is below the
group's highest never entered the collective the others wait in, the first one it lacks. At each
sequence number every rank recorded, the op, input/output sizes and dtypes are compared; the ranks
outside the largest agreeing set mismatch (fr_trace's COLLECTIVE_TYPE_MISMATCH,
SIZE_OR_SYNTAX_MISMATCH, COLLECTIVE_DTYPE_MISMATCH). Members without a dump are named: a rank that
died or was never dumped is the likeliest culprit."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pandas as pd
from diag.analyzers.base import rule

from diag.findings import Finding, Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

_SIG = ("op", "in_sizes", "out_sizes", "in_dtypes", "out_dtypes")
_STATE = {
    "op": "COLLECTIVE_TYPE_MISMATCH",
    "in_sizes": "SIZE_OR_SYNTAX_MISMATCH",
    "out_sizes": "SIZE_OR_SYNTAX_MISMATCH",
    "in_dtypes": "COLLECTIVE_DTYPE_MISMATCH",
    "out_dtypes": "COLLECTIVE_DTYPE_MISMATCH",
}


def members(trace: Trace, pg: str) -> list[int] | None:
    """The group's ranks as its dumps' `pg_config` states them (gloo's default group is keyed '')."""
    g = trace.frame("fr_group")
    if g.empty:
        return None
    rows = g[g["pg"].astype(str) == pg]
    if rows.empty and g["pg"].nunique() == 1:
        rows = g
    for text in rows["ranks"]:
        try:
            ranks = json.loads(str(text))
        except ValueError:
            continue
        if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
            return sorted(ranks)
    return None


def _describe(e: pd.Series) -> dict[str, Any]:
    return {
        "seq": int(e["seq"]),
        "op": str(e["op"]),
        "input_sizes": json.loads(e["in_sizes"] or "null"),
        "output_sizes": json.loads(e["out_sizes"] or "null"),
        "dtypes": json.loads(e["in_dtypes"] or "null"),
        "called_at": str(e.get("where") or ""),
    }


def _dtypes(d: Any) -> str:
    return ",".join(sorted({str(x) for x in d})) if isinstance(d, list) else ""


def mismatch(coll: pd.DataFrame) -> dict[str, Any] | None:
    """The first sequence number every dumped rank recorded whose calls differ, with who differs."""
    ranks = coll["rank"].nunique()
    for seq, at in coll.groupby("seq", sort=True):
        if at["rank"].nunique() < ranks or at[list(_SIG)].drop_duplicates().shape[0] == 1:
            continue
        sig = at.groupby(list(_SIG), sort=False)["rank"].apply(lambda r: sorted(int(x) for x in r))
        major = max(sig.items(), key=lambda kv: len(kv[1]))
        others = [(k, v) for k, v in sig.items() if k != major[0]]
        first = others[0][0]
        field = next(f for f, a, b in zip(_SIG, major[0], first) if a != b)
        return {
            "seq": int(seq),
            "state": _STATE[field],
            "majority": {"ranks": major[1], **dict(zip(_SIG, major[0]))},
            "differ": [{"ranks": v, **dict(zip(_SIG, k))} for k, v in others],
        }
    return None


def _group(trace: Trace, pg: str, coll: pd.DataFrame) -> Finding | None:
    last = coll.groupby("rank")["seq"].max().astype(int)
    top = int(last.max())
    behind = {int(r): int(s) for r, s in last.items() if s < top}
    dumped = sorted(int(r) for r in last.index)
    group = members(trace, pg)
    missing = sorted(set(group) - set(dumped)) if group else []
    mm = mismatch(coll)
    if not behind and not mm and not missing:
        return None
    desc = str(coll["pg_desc"].iloc[0] or pg)
    ev: dict[str, Any] = {
        "group": pg,
        "group_desc": desc,
        "members": group,
        "dumped_ranks": dumped,
        "missing_dumps": missing,
        "last_seq": {int(r): int(s) for r, s in last.items()},
    }
    parts, ranks = [], set(missing)
    if behind:
        lag = min(behind.values())
        waiting = coll[(coll["seq"] == lag + 1)]
        w = _describe(waiting.iloc[0]) if not waiting.empty else {"seq": lag + 1}
        ev["behind"] = behind
        ev["waiting_in"] = {**w, "ranks": sorted(int(r) for r in waiting["rank"].unique())}
        ranks |= set(behind)
        slow = ", ".join(str(r) for r in sorted(behind))
        parts.append(
            f"rank(s) {slow} stopped at seq {lag} while rank(s) "
            f"{', '.join(str(r) for r in ev['waiting_in']['ranks'])} entered seq {lag + 1} "
            f"{w.get('op', '?')} {w.get('input_sizes', '')} {_dtypes(w.get('dtypes'))}".rstrip()
            + (f" at {w['called_at']}" if w.get("called_at") else "")
        )
    if mm:
        ev["mismatch"] = mm
        d = mm["differ"][0]
        ranks |= {r for x in mm["differ"] for r in x["ranks"]}
        parts.append(
            f"seq {mm['seq']}: rank(s) {', '.join(map(str, d['ranks']))} called {d['op']} "
            f"{d['in_sizes']} where rank(s) {', '.join(map(str, mm['majority']['ranks']))} called "
            f"{mm['majority']['op']} {mm['majority']['in_sizes']} ({mm['state']})"
        )
    if missing:
        parts.append(f"no dump from member rank(s) {', '.join(map(str, missing))}")
    return Finding(
        severity="critical" if (mm or behind) else "warning",
        title=f"hang in group {desc}: {parts[0].split(' at /')[0]}",
        detail="; ".join(parts) + ".",
        evidence=ev,
        ranks=sorted(ranks),
        fixes=[
            Fix(
                "look at the named ranks' stacks where they stopped (py-spy dump, `diag stacks`): the "
                "code path that skipped or reordered a collective (a rank-dependent branch, an early "
                "exit, a data-dependent shape)"
            ),
            Fix(
                "record more history and dump on every timeout next time",
                env={
                    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
                },
            ),
        ],
    )


@rule("collective_desync")
def collective_desync(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires on Flight Recorder dumps (`fr_entry`) where, in one process group, a rank's last collective
    sequence number is below the others' (it never entered the collective they wait in), the ranks'
    calls at one sequence number differ in op, sizes or dtype, or a member rank left no dump. Critical
    for the first two. No threshold: any difference. Fix: the named ranks' stacks; more FR history."""
    fr = trace.frame("fr_entry")
    if fr.empty:
        return []
    coll = fr[~fr["is_p2p"].astype(bool)].dropna(subset=["seq"])
    coll = coll.assign(seq=coll["seq"].astype(int), pg=coll["pg"].astype(str))
    found = [_group(trace, pg, c) for pg, c in coll.groupby("pg", sort=True)]
    return [f for f in found if f is not None]
