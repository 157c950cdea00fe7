"""Collectives of one Kineto trace as a diag `comm` frame (same columns as the agent writes).

GPU/NCCL traces: each communication kernel is one collective; its op, message size, dtype and group
come from the `record_param_comms` host op that launched it (the last one at or before the kernel's
launch on that rank), its time from the kernel. CPU/gloo traces have no `record_param_comms`: the
`gloo:<op>` annotations on the gloo thread are the executions (their Input Dims/type give the size).
Message size follows nccl-tests: the larger of input and output (all_gather: the gathered output);
a collective whose size nothing records (DeepEP kernels, old traces) has bytes NaN: unknown, not 0.
The op: DeepEP kernels are all_to_all by name; else the record_param_comms' collective name, else the
host collective around the launch (`nccl:all_to_all`, `c10d::alltoall_base_`: NCCL runs all-to-all as
a `SendRecv` kernel), else the kernel's name.
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np
import pandas as pd

from diag import schema
from diag.importers.kineto_names import element_bytes
from diag.metrics import bandwidth
from diag.vocab import (
    CANONICAL_OPS,
    COMM,
    COMM_KERNEL_RE,
    P2P,
    UNKNOWN_OP,
    UNNAMED_GROUP,
    canonical_op,
    host_comm_op,
    kernel_op,
)

_COLUMNS = ("rank", *schema.FIELDS[schema.COMM], "algbw", "busbw")


def _finish(df: pd.DataFrame) -> pd.DataFrame:
    df["algbw"] = bandwidth.algbw(df["bytes"], df["dur"])
    df["busbw"] = bandwidth.busbw(df["op"], df["bytes"], df["dur"], df["group_size"])
    for col in ("op", "dtype", "group"):
        df[col] = df[col].astype("category")
    return df[list(_COLUMNS)].sort_values("ts", kind="stable").reset_index(drop=True)


def _last_start(starts: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Index of the last interval starting at or before each time, -1 where none does."""
    return np.searchsorted(starts, at, side="right") - 1


def _enclosing_host_op(host: pd.DataFrame, launch: np.ndarray) -> list[str | None]:
    """The canonical op of the host collective (`c10d::alltoall_base_`, `nccl:all_to_all`) whose span
    holds each launch, None where none does."""
    names = host["name"].astype(str)
    ops = names.map({n: host_comm_op(n) for n in names.unique()})
    h = host[ops.notna().to_numpy()].assign(op=ops[ops.notna()]).sort_values("ts", kind="stable")
    if h.empty:
        return [None] * len(launch)
    i = _last_start(h["ts"].to_numpy(), launch)
    ends, hop = (h["ts"] + h["dur"]).to_numpy(), h["op"].to_numpy()
    return [hop[j] if j >= 0 and t >= 0 and t <= ends[j] else None for j, t in zip(i, launch)]


def _bytes(a: dict[str, Any], dtype: object) -> float:
    """nccl-tests' message size of one record_param_comms: NaN (unknown) when it carries no sizes."""
    if a.get("In msg nelems") is None and a.get("Out msg nelems") is None:
        return np.nan
    return max(int(a.get("In msg nelems") or 0), int(a.get("Out msg nelems") or 0)) * element_bytes(dtype)


def _from_param_comms(kernels: pd.DataFrame, host: pd.DataFrame, world: int) -> dict[str, Any]:
    """Each kernel's record_param_comms: the one whose span holds its launch; for NCCL kernels
    (always launched by one) also the last one before it, as older torch closed it early. DeepEP
    kernels have none: their op comes from the kernel name and their size is unknown."""
    k = kernels.sort_values("launch_ts", kind="stable")
    names = k["name"].astype(str)
    launch = k["launch_ts"].to_numpy()
    rpc = host[host["name"] == "record_param_comms"].sort_values("ts", kind="stable")
    i = _last_start(rpc["ts"].to_numpy(), launch)
    ends = (rpc["ts"] + rpc["dur"]).to_numpy()
    nccl = names.str.match(COMM_KERNEL_RE).to_numpy() | names.str.match(r"(?i)^rccl").to_numpy()
    fixed = names.map(kernel_op).to_numpy()
    use = (i >= 0) & (launch >= 0) & (nccl | (launch <= ends[np.clip(i, 0, None)] if len(ends) else False))
    rpc_args = rpc["args"].to_numpy()
    args = [rpc_args[j] or {} if ok else {} for j, ok in zip(i, use)]
    enclosing = _enclosing_host_op(host, launch)
    ops = []
    for a, host_op, kop in zip(args, enclosing, fixed):
        named = canonical_op(str(a["Collective name"])) if a.get("Collective name") else None
        ops.append(
            kop
            if kop != UNKNOWN_OP and kop not in P2P
            else named
            if named in CANONICAL_OPS
            else host_op or kop
        )
    dtype = [a.get("dtype") for a in args]
    return {
        "ts": k["ts"].to_numpy(),
        "dur": k["dur"].to_numpy(),
        "op": ops,
        "bytes": np.array([_bytes(a, d) for a, d in zip(args, dtype)], dtype=float),
        "dtype": dtype,
        "group_size": [int(a.get("Group size", world) or world) for a in args],
        "group": [str(a.get("Process Group Name", UNNAMED_GROUP)) for a in args],
        "group_ranks": [a.get("Process Group Ranks") for a in args],
    }


def _from_gloo(ann: pd.DataFrame, world: int) -> dict[str, Any]:
    ops = [canonical_op(n) for n in ann["name"].astype(str)]
    dims = [(a.get("Input Dims") or [[]])[0] for a in ann["args"]]
    types = [(a.get("Input type") or [None])[0] for a in ann["args"]]
    numel = [
        prod(d)
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d)
        else 0
        if op == "barrier"
        else np.nan  # no dims: size unknown, not 0 (a barrier has none)
        for d, op in zip(dims, ops)
    ]
    nbytes = np.array(
        [n * element_bytes(t) * (world if op == "all_gather" else 1) for n, t, op in zip(numel, types, ops)],
        dtype=float,
    )
    return {
        "ts": ann["ts"].to_numpy(),
        "dur": ann["dur"].to_numpy(),
        "op": ops,
        "bytes": nbytes,
        "dtype": types,
        "group_size": world,
        "group": UNNAMED_GROUP,
        "group_ranks": None,
    }


def comm_frame(host: pd.DataFrame, kernels: pd.DataFrame, info: dict[str, Any], rank: int) -> pd.DataFrame:
    """The collectives of one rank, from NCCL kernels when there are any, else from gloo annotations."""
    world = int(info.get("world_size") or 1)
    comm_k = kernels[kernels["kind"] == COMM]
    if len(comm_k):
        cols = _from_param_comms(comm_k, host, world)
    else:
        cols = _from_gloo(host[host["name"].str.startswith("gloo:")], world)
    df = pd.DataFrame({"rank": rank, "step": -1, "module": None, "async_op": False, **cols})
    return _finish(df)
