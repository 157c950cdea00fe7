"""Helpers the rules share: per-step tables, op-name canonicalization, host topology, effective config.

Kept here (not in diag/metrics) only for what the rules need and the metrics package does not offer;
the rules stay pure functions of a `Trace`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from diag import schema
from diag.metrics import intervals

if TYPE_CHECKING:
    from diag.trace.model import Trace

NS = 1e9

# DeepSpeed's code defaults, which differ from its docs (DESIGN.md): the rules read the engine's
# effective config first and fall back to these.
DS_DEFAULTS: dict[str, Any] = {
    "stage3_prefetch_bucket_size": 5e7,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "stage3_param_persistence_threshold": 1e5,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}

_OPS = (  # substring -> canonical name, most specific first
    ("reduce_scatter", "reduce_scatter"), ("_reduce_scatter_base", "reduce_scatter"),
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"), ("all_gather", "all_gather"),
    ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"), ("barrier", "barrier"), ("isend", "send"), ("irecv", "recv"),
    ("send", "send"), ("recv", "recv"), ("reduce", "reduce"), ("gather", "gather"),
    ("scatter", "scatter"),
)
P2P = ("send", "recv")


def canon_op(op: Any) -> str:
    """Canonical collective name for any spelling (torch, deepspeed.comm, c10d, gloo, NCCL kernels)."""
    name = str(op).lower().replace("ncclkernel_", "").replace("ncclDevKernel_".lower(), "")
    for key, canon in _OPS:
        if key in name:
            return canon
    return name


def comms(trace: Trace) -> pd.DataFrame:
    """The comm frame with a canonical `kind` column and seconds (`dur_s`); empty-safe."""
    df = trace.comms.copy()
    if df.empty:
        df["kind"] = pd.Series(dtype=str)
        df["dur_s"] = pd.Series(dtype=float)
        return df
    df["kind"] = df["op"].astype(str).map(canon_op)
    df["dur_s"] = pd.to_numeric(df["dur"], errors="coerce").fillna(0) / NS
    # busbw again from the canonical name: the writer's factor only knows canonical spellings
    nbytes = pd.to_numeric(df["bytes"], errors="coerce").fillna(0)
    factor = [schema.bus_factor(k, int(n or 0)) for k, n in zip(df["kind"], df["group_size"].fillna(0))]
    alg = (nbytes / (df["dur_s"] * NS)).where(df["dur_s"] > 0, 0.0)
    df["busbw"] = alg * factor
    return _attribute_steps(df, trace)


def _attribute_steps(df: pd.DataFrame, trace: Trace) -> pd.DataFrame:
    """Imported traces (Kineto) carry step -1: give each collective the step whose span holds it."""
    step = pd.to_numeric(df["step"], errors="coerce")
    st = steps(trace)
    if not (step.isna() | (step < 0)).any() or st.empty:
        return df
    df = df.assign(ts=pd.to_numeric(df["ts"]).astype("int64")).sort_values("ts")
    spans = st[["rank", "step", "start", "end"]].rename(columns={"step": "_step"}).sort_values("start")
    m = pd.merge_asof(df.reset_index(), spans, left_on="ts", right_on="start", by="rank")
    inside = m["_step"].where(m["ts"] < m["end"])
    old = pd.to_numeric(m["step"], errors="coerce")
    m["step"] = old.where(old >= 0, inside)
    return m.set_index("index").drop(columns=["_step", "start", "end"]).dropna(subset=["step"])


def transfer_dur(c: pd.DataFrame) -> pd.Series:
    """Each collective's duration without waiting for late ranks: the k-th op of a group takes, on
    every member, at least the transfer; the rank that arrived last waited least, so the minimum over
    the members is the transfer time (the rest is waiting for a straggler)."""
    if c.empty:
        return pd.Series(dtype=float)
    key = c["group"].astype(str)
    k = c.sort_values("ts").groupby([c["rank"], key], observed=True).cumcount()
    frame = pd.DataFrame({"g": key, "k": k.reindex(c.index), "dur": pd.to_numeric(c["dur"])})
    return frame.groupby(["g", "k"])["dur"].transform("min")


def steps(trace: Trace) -> pd.DataFrame:
    """One row per (rank, step): `dur_s`, `start`, `end` (ns). Steps with no duration are dropped."""
    df = trace.steps.copy()
    if df.empty:
        return pd.DataFrame(columns=["rank", "step", "ts", "dur", "dur_s", "start", "end"])
    df["dur"] = pd.to_numeric(df["dur"], errors="coerce")
    df = df.dropna(subset=["dur"])
    df = df[df["dur"] > 0].copy()
    df["dur_s"] = df["dur"] / NS
    df["start"] = pd.to_numeric(df["ts"])
    df["end"] = df["start"] + df["dur"]
    return df.sort_values(["rank", "step"]).reset_index(drop=True)


def steady(df: pd.DataFrame, skip: int = 1) -> pd.DataFrame:
    """Drop each rank's first `skip` steps (warm-up) when enough steps remain."""
    if df.empty or df.groupby("rank").size().min() <= skip + 1:
        return df
    first = df.groupby("rank")["step"].transform(lambda s: sorted(s)[skip])
    return df[df["step"] >= first]


def comm_per_step(trace: Trace, mask: pd.Series | None = None) -> pd.DataFrame:
    """Seconds of (selected) communication per (rank, step), joined to the step's duration."""
    c = comms(trace)
    if mask is not None:
        c = c[mask.reindex(c.index, fill_value=False)]
    st = steady(steps(trace))
    per = c.groupby(["rank", "step"], observed=True)["dur_s"].sum().rename("comm_s").reset_index()
    out = st[["rank", "step", "dur_s"]].merge(per, on=["rank", "step"], how="left")
    out["comm_s"] = out["comm_s"].fillna(0.0)
    return out


def union_s(starts: pd.Series, durs: pd.Series) -> float:
    """Seconds covered by the union of [start, start + dur) intervals (nested or async ops count once)."""
    ts = starts.to_numpy(dtype="int64")
    return intervals.total(*intervals.merge(ts, ts + durs.to_numpy(dtype="int64"))) / NS


def union_per_step(trace: Trace, mask: pd.Series | None = None) -> pd.DataFrame:
    """Like `comm_per_step`, but `comm_s` is the union of the ops' intervals, not their sum."""
    c = comms(trace)
    if mask is not None:
        c = c[mask.reindex(c.index, fill_value=False)]
    st = steady(steps(trace))
    if c.empty:
        return st[["rank", "step", "dur_s"]].assign(comm_s=0.0)
    per = (c.groupby(["rank", "step"], observed=True)
           .apply(lambda g: union_s(pd.to_numeric(g["ts"]), pd.to_numeric(g["dur"]).fillna(0)))
           .rename("comm_s").reset_index())
    out = st[["rank", "step", "dur_s"]].merge(per, on=["rank", "step"], how="left")
    return out.fillna({"comm_s": 0.0})


def median_step_s(trace: Trace) -> float:
    st = steady(steps(trace))
    return float(st["dur_s"].median()) if not st.empty else 0.0


def hosts(trace: Trace) -> dict[int, str]:
    return {r: str(h.get("host") or "?") for r, h in trace.headers.items()}


def spans_hosts(ranks: Any, host_of: dict[int, str]) -> bool:
    """Does a group (list of global ranks) include ranks on more than one host?"""
    if ranks is None or isinstance(ranks, float):
        return len(set(host_of.values())) > 1
    return len({host_of.get(int(r), "?") for r in ranks} - {"?"}) > 1


def ds_config(trace: Trace) -> dict[str, Any]:
    cfg = trace.layout().get("ds_config")
    return cfg if isinstance(cfg, dict) else {}


def zero_config(trace: Trace) -> dict[str, Any]:
    """The effective zero config: the engine's dump when recorded, else the user's ds_config section."""
    for rank in trace.ranks:
        zc = trace.headers[rank].get("zero_config")
        if isinstance(zc, dict):
            return zc
    zo = ds_config(trace).get("zero_optimization")
    return zo if isinstance(zo, dict) else {}


def zero_stage(trace: Trace) -> int:
    stage = trace.layout().get("zero_stage")
    if stage is None:
        stage = zero_config(trace).get("stage", 0)
    try:
        return int(stage)
    except (TypeError, ValueError):
        return 0


def setting(trace: Trace, key: str) -> Any:
    """A ZeRO / fp16 setting as the job ran it: effective config, then ds_config, then code default."""
    zc = zero_config(trace)
    for name in (key, key.removeprefix("stage3_")):  # the engine's dump uses field names, not aliases
        if zc.get(name) is not None:
            return zc[name]
    fp16 = ds_config(trace).get("fp16")
    if isinstance(fp16, dict) and key in fp16:
        return fp16[key]
    if key == "overlap_comm":
        return zero_stage(trace) == 3  # the code default: true only for stage 3
    return DS_DEFAULTS.get(key)


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"
