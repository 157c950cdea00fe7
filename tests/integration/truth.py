"""Ground truth from the workloads' result files, in diag's vocabulary (canonical op names)."""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd

# torch.profiler's c10d dispatcher op -> diag's canonical op name
PROFILER_OPS = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast",
    "barrier": "barrier",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "send": "send",
    "recv_": "recv",
}
# DeepSpeed comms logger's record name -> canonical op name
DS_OPS = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "allgather_fn": "all_gather",
    "reduce_scatter_fn": "reduce_scatter",
}


def profiler_counts(rank_result: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for op, n in rank_result["truth_comms"]["counts"].items():
        name = PROFILER_OPS.get(op, op)
        out[name] = out.get(name, 0) + n
    return out


# records whose logged size is one rank's input while diag (like nccl-tests) counts the whole buffer
DS_PER_RANK = {"all_gather_into_tensor", "allgather_fn"}


def ds_bytes(rank_result: dict[str, Any], group_size: int) -> dict[str, int]:
    """Bytes per op in diag's convention (nccl-tests' "size": the full buffer of the collective)."""
    out: dict[str, int] = {}
    for op, rec in rank_result["ds_comms"].items():
        name = DS_OPS.get(op, op)
        scale = group_size if op in DS_PER_RANK else 1
        out[name] = out.get(name, 0) + rec["bytes"] * scale
    return out


def ds_counts(rank_result: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for op, rec in rank_result["ds_comms"].items():
        name = DS_OPS.get(op, op)
        out[name] = out.get(name, 0) + rec["count"]
    return out


def agent_comms(comms: pd.DataFrame, rank: int) -> tuple[dict[str, int], dict[str, int]]:
    """(count, bytes) per op of one rank's comm records."""
    mine = comms[comms["rank"] == rank]
    ops = mine["op"].astype(str)
    counts = ops.value_counts().to_dict()
    nbytes = mine.groupby(ops, observed=True)["bytes"].sum().astype(int).to_dict()
    return {k: int(v) for k, v in counts.items()}, {k: int(v) for k, v in nbytes.items()}


def layer_rows(layers: pd.DataFrame, rank: int, suffix: str, phase: str) -> pd.DataFrame:
    """One module's records on one rank (matched by the end of its qualified name)."""
    mods = layers["module"].astype(str)
    sel = (
        (layers["rank"] == rank)
        & (layers["phase"].astype(str) == phase)
        & ((mods == suffix) | mods.str.endswith("." + suffix))
    )
    return layers[sel]


def per_step(rows: pd.DataFrame, col: str) -> dict[int, int]:
    """Sum of `col` per step (a module may have several records in one step: readers sum them)."""
    return {int(k): int(v) for k, v in rows.groupby("step")[col].sum().items()}


def module_tree_problems(recs: list[dict[str, Any]], own: dict[str, int] | None = None) -> list[str]:
    """Layer records (dicts) of one rank checked as a tree, per step and phase: one root; each
    module's window inside one of its parent's (qualified-name prefix; top-level modules inside the
    root's), siblings' windows disjoint, a parent's FLOPs the sum of its children's plus its own ops
    (`own`: module-name suffix -> FLOPs per step and phase; else at least the children's)."""
    out: list[str] = []
    by: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in recs:
        by.setdefault((r["step"], r["phase"]), []).append(r)
    for (step, phase), rs in sorted(by.items()):
        where = f"step {step} {phase}"
        names = {r["module"] for r in rs}
        roots = [n for n in names if "." not in n and n[:1].isupper()]
        if len(roots) != 1:
            out.append(f"{where}: roots {roots}")
            continue
        kids: dict[str, list[dict[str, Any]]] = {}
        for r in rs:
            if r["module"] != roots[0]:
                p = _parent(r["module"], names, roots[0])
                kids.setdefault(p, []).append(r)
                if not any(_within(r, q) for q in rs if q["module"] == p):
                    out.append(f"{where}: {r['module']} not within {p}")
        for p, ks in kids.items():
            spans = sorted((k["ts"], k["ts"] + k["dur"], k["module"]) for k in ks)
            out += [f"{where}: {a[2]} overlaps {b[2]}" for a, b in itertools.pairwise(spans) if b[0] < a[1]]
            mine = sum(q["flops"] or 0 for q in rs if q["module"] == p)
            theirs = sum(k["flops"] or 0 for k in ks)
            extra = next((f for suffix, f in (own or {}).items() if p.endswith(suffix)), 0)
            if (mine != theirs + extra) if own is not None else mine < theirs:
                out.append(f"{where}: {p} FLOPs {mine} != children {theirs} + own {extra}")
    return out


def _parent(name: str, names: set[str], root: str) -> str:
    while "." in name:
        name = name.rsplit(".", 1)[0]
        if name in names:
            return name
    return root


def _within(inner: dict[str, Any], outer: dict[str, Any]) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
