"""Collectives of one Kineto trace as a diag `comm` frame (same columns as the agent writes).

GPU/NCCL traces: each communication kernel is one collective; its op, message size, dtype and group
come from the `record_param_comms` host op that launched it (the last one at or before the kernel's
launch on that rank), its time from the kernel. CPU/gloo traces have no `record_param_comms`: the
`gloo:<op>` annotations on the gloo thread are the executions (their Input Dims/type give the size).
Message size follows nccl-tests: the larger of input and output (all_gather: the gathered output).
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np
import pandas as pd

from diag import schema
from diag.importers.kineto_names import element_bytes
from diag.metrics import bandwidth
from diag.vocab import COMM, canonical_op

_COLUMNS = ("rank", *schema.FIELDS[schema.COMM], "algbw", "busbw")


def _finish(df: pd.DataFrame) -> pd.DataFrame:
    df["algbw"] = bandwidth.algbw(df["bytes"], df["dur"])
    df["busbw"] = bandwidth.busbw(df["op"], df["bytes"], df["dur"], df["group_size"])
    for col in ("op", "dtype", "group"):
        df[col] = df[col].astype("category")
    return df[list(_COLUMNS)].sort_values("ts", kind="stable").reset_index(drop=True)


def _from_param_comms(kernels: pd.DataFrame, rpc: pd.DataFrame, world: int) -> dict[str, Any]:
    k = kernels.sort_values("launch_ts", kind="stable")
    rpc = rpc.sort_values("ts", kind="stable")
    i = np.searchsorted(rpc["ts"].to_numpy(), k["launch_ts"].to_numpy(), side="right") - 1
    args = [rpc["args"].iloc[j] if j >= 0 else {} for j in i]
    size = [int(a.get("Group size", world) or world) for a in args]
    dtype = [a.get("dtype") for a in args]
    nbytes = [max(int(a.get("In msg nelems", 0) or 0), int(a.get("Out msg nelems", 0) or 0))
              * element_bytes(d) for a, d in zip(args, dtype)]
    ops = [canonical_op(str(a["Collective name"])) if a.get("Collective name") else canonical_op(n)
           for a, n in zip(args, k["name"].astype(str))]
    return {"ts": k["ts"].to_numpy(), "dur": k["dur"].to_numpy(), "op": ops, "bytes": nbytes,
            "dtype": dtype, "group_size": size,
            "group": [str(a.get("Process Group Name", "default")) for a in args],
            "group_ranks": [a.get("Process Group Ranks") for a in args]}


def _from_gloo(ann: pd.DataFrame, world: int) -> dict[str, Any]:
    ops = [canonical_op(n) for n in ann["name"].astype(str)]
    dims = [(a.get("Input Dims") or [[]])[0] for a in ann["args"]]
    types = [(a.get("Input type") or [None])[0] for a in ann["args"]]
    numel = [prod(d) if isinstance(d, list) and all(isinstance(x, int) for x in d) else 0 for d in dims]
    nbytes = [n * element_bytes(t) * (world if op == "all_gather" else 1)
              for n, t, op in zip(numel, types, ops)]
    return {"ts": ann["ts"].to_numpy(), "dur": ann["dur"].to_numpy(), "op": ops, "bytes": nbytes,
            "dtype": types, "group_size": world, "group": "default", "group_ranks": None}


def comm_frame(host: pd.DataFrame, kernels: pd.DataFrame, info: dict[str, Any], rank: int) -> pd.DataFrame:
    """The collectives of one rank, from NCCL kernels when there are any, else from gloo annotations."""
    world = int(info.get("world_size") or 1)
    comm_k = kernels[kernels["kind"] == COMM]
    if len(comm_k):
        cols = _from_param_comms(comm_k, host[host["name"] == "record_param_comms"], world)
    else:
        cols = _from_gloo(host[host["name"].str.startswith("gloo:")], world)
    df = pd.DataFrame({"rank": rank, "step": -1, "module": None, "async_op": False, **cols})
    return _finish(df)
