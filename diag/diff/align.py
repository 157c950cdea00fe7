"""Put two runs with different layouts on the same axes.

- Collectives are matched by kind and role, not by process-group id (ids differ between runs):
  `pp` (send/recv), `tp` (a tensor-parallel group, or all_reduces issued inside a layer of a
  job without DeepSpeed), `zero-gather` (all_gather of ZeRO-3 parameters), `dp-grad` (gradient
  all_reduce / reduce_scatter on the data-parallel group), `dp` (other data-parallel traffic).
- Layers are matched by qualified name with wrapper prefixes folded (`DeepSpeedEngine`, `module.`),
  and TP shards folded: every rank's record of a name counts toward the one layer; a pipeline
  stage's locally numbered layers (`decoder.layers.0` on the second of two stages) take their
  model-wide index (`decoder.layers.2`) from the agent's `layer_numbers` record.
- Sizes are per step, per sample or per token (`units`), from the step records' samples/tokens.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diag import schema
from diag.diff import adapter
from diag.metrics import steps as step_frames
from diag.metrics.comms import between_ranks
from diag.metrics.layer_stats import global_layer_names, steady_samples

if TYPE_CHECKING:
    from diag.trace.model import Trace

ROLES = {
    "pp": "pipeline send/recv",
    "tp": "tensor-parallel activations",
    "zero-gather": "ZeRO-3 parameter gathers on the data-parallel group",
    "dp-grad": "data-parallel gradient reduction",
    "dp": "data-parallel group",
    "other": "other group",
}
_P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
_WRAPPERS = re.compile(r"^(DeepSpeedEngine\.|module\.)+")
ROOTS = ("DeepSpeedEngine", "module")


def _inferred_tp(trace: Trace, lay: dict[str, Any]) -> int:
    """A job without DeepSpeed whose header lacks TP: the group size of the all_reduces issued
    inside layers (Megatron's tensor-parallel mappings), else 1."""
    c = trace.comms
    if lay.get("zero_stage") is not None or lay.get("ds_config") or c.empty:
        return 1
    inside = c[(c["op"].astype(str) == "all_reduce") & c["module"].notna()]
    return int(pd.to_numeric(inside["group_size"], errors="coerce").max()) if len(inside) else 1


def layout(trace: Trace) -> dict[str, Any]:
    lay = trace.layout()
    world = int(lay.get("world_size") or len(trace.ranks) or 1)
    tp, pp = int(lay.get("tp") or _inferred_tp(trace, lay)), int(lay.get("pp") or 1)
    others = math.prod(int(lay.get(k) or 1) for k in schema.WORLD_FACTORS if k not in ("tp", "pp", "dp"))
    dp = int(lay.get("dp") or max(world // (tp * pp * others), 1))
    return {**lay, "world_size": world, "tp": tp, "pp": pp, "dp": dp}


def _role(op: str, size: int, module: object, lay: dict[str, Any]) -> str:
    zero = lay.get("zero_stage")
    if op in _P2P:
        return "pp"
    if lay["tp"] > 1 and size == lay["tp"] and size != lay["dp"]:
        return "tp"
    if op == "all_gather" and zero == 3:
        return "zero-gather"
    if op in ("all_reduce", "reduce_scatter") and size == lay["dp"]:
        return "dp-grad"
    return "dp" if size == lay["dp"] else "other"


def comm_roles(trace: Trace) -> pd.DataFrame:
    """The comm frame with `role` and `key` (`op:role`) columns; computed once per trace."""
    memo = vars(trace).setdefault("_diff_cache", {})
    if "roles" not in memo:
        c = between_ranks(trace.comms).copy()  # as `diag analyze`'s split counts them
        lay = layout(trace)
        sizes = pd.to_numeric(c["group_size"], errors="coerce").fillna(0).astype(int)
        c["op"] = c["op"].astype(str)
        c["role"] = [_role(o, s, m, lay) for o, s, m in zip(c["op"], sizes, c["module"])]
        c["key"] = c["op"] + ":" + c["role"]
        c["async_op"] = c["async_op"].astype("boolean").fillna(False).astype(bool)
        memo["roles"] = c
    return memo["roles"]


def fold_layer(name: str) -> str:
    """`DeepSpeedEngine.module.blocks.0` -> `blocks.0`; the wrappers themselves -> `(model)`."""
    return "(model)" if name in ROOTS else _WRAPPERS.sub("", name)


def units(trace: Trace) -> dict[str, float | None]:
    """Median samples and tokens per step (global batch) from the step records, else the log's
    global batch size; None when the run does not say."""
    st, log = trace.steps, trace.frame("log_step")
    out: dict[str, float | None] = {}
    for col, log_col in (("samples", "global_batch"), ("tokens", None)):
        v = pd.to_numeric(st[col], errors="coerce") if col in st.columns else pd.Series(dtype=float)
        steps = st["step"]
        if not v.notna().any() and log_col and log_col in log.columns:
            v, steps = pd.to_numeric(log[log_col], errors="coerce"), log["step"]
        per_step = v.groupby(steps).max().dropna() if v.notna().any() else pd.Series(dtype=float)
        out[col] = float(per_step.median()) if len(per_step) else None
    return out


def layer_table(trace: Trace) -> pd.DataFrame:
    """Per folded layer and phase: mean time per sampled rank-step (ns) and FLOPs per step of one
    model replica (all ranks' FLOPs on the step / data-parallel replicas), over the steady samples as
    `diag analyze`'s top layers (the warm-up step's where a rank has no other): a run whose first
    step waited longer in its first collectives read as a slower layer."""
    cols = ["layer", "phase", "time_ns", "flops"]
    if trace.layers.empty or "module" not in trace.layers.columns:
        return pd.DataFrame(columns=cols)
    lay = steady_samples(trace.layers, step_frames.steady(step_frames.step_frame(trace.steps)))
    dp = layout(trace)["dp"]
    d = lay.assign(
        layer=global_layer_names(trace, lay).map(fold_layer),
        phase=lay["phase"].astype(str),
        flops=pd.to_numeric(lay["flops"], errors="coerce").fillna(0),
    )
    # a layer called twice in a step counts twice; wrappers of the same work (DeepSpeedEngine and
    # its `module`) fold to one name and count once (the larger)
    raw = d.groupby(["layer", "phase", "rank", "step", "module"], observed=True).agg(
        dur=("dur", "sum"), flops=("flops", "sum")
    )
    per = raw.groupby(level=["layer", "phase", "rank", "step"], observed=True).max()
    g = per.groupby(level=["layer", "phase"], observed=True)
    steps = per.reset_index().groupby(["layer", "phase"], observed=True)["step"].nunique()
    out = pd.DataFrame({"time_ns": g["dur"].mean(), "flops": g["flops"].sum() / steps / dp})
    return out.reset_index()[cols]


def collective_table(trace: Trace) -> pd.DataFrame:
    """Per `op:role`: calls, bytes and time per step and rank, and busbw over all calls (GB/s)."""
    c = comm_roles(trace)
    cols = ["key", "calls", "bytes", "time_ns", "busbw"]
    if c.empty:
        return pd.DataFrame(columns=cols)
    c = c.assign(
        bw=adapter.busbw(c["op"], c["bytes"], c["dur"], c["group_size"]),
        dur=pd.to_numeric(c["dur"], errors="coerce").fillna(0),
    )
    c = c.assign(bwt=c["bw"] * c["dur"])
    per = max(c["step"].nunique(), 1) * max(c["rank"].nunique(), 1)
    g = c.groupby("key", observed=True)
    out = pd.DataFrame(
        {
            "calls": g.size() / per,
            "bytes": g["bytes"].sum() / per,
            "time_ns": g["dur"].sum() / per,
            "busbw": g["bwt"].sum() / g["dur"].sum().where(g["dur"].sum() > 0),
        }
    )
    return out.reset_index()[cols]


def memory_peaks(trace: Trace) -> dict[str, float | None]:
    """Highest device peak and host RSS over all ranks (bytes); None when not recorded."""
    m = trace.memory
    out: dict[str, float | None] = {}
    for col in ("peak", "rss"):
        v = pd.to_numeric(m[col], errors="coerce") if col in m.columns else pd.Series(dtype=float)
        out[col] = float(np.nanmax(v)) if v.notna().any() else None
    return out
