"""Helpers the rules share: per-step tables, host topology, effective config.

Kept here (not in diag/metrics) only for what the rules need and the metrics package does not offer:
op names come from the importers' `canonical_op`, bus bandwidth from `diag.metrics.bandwidth`,
interval unions from `diag.metrics.intervals` (vectorized over ranks and steps), and the tables
every rule asks for are computed once per trace (`diag.metrics.breakdown.cached`).
The rules stay pure functions of a `Trace`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from diag.metrics import bandwidth, intervals
from diag.metrics.breakdown import cached
from diag.vocab import canonical_op

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

P2P = ("send", "recv", "send_recv")


def comms(trace: Trace) -> pd.DataFrame:
    """The comm frame with a canonical `kind` column, seconds (`dur_s`) and every collective in a
    step (imported traces); computed once per trace, callers get a copy. Empty-safe."""
    return _comm_frame(trace)


@cached
def _comm_frame(trace: Trace) -> pd.DataFrame:
    df = trace.comms.copy()
    if df.empty:
        return df.assign(kind=pd.Series(dtype=str), dur_s=pd.Series(dtype=float))
    ops = df["op"].astype(str)
    df["kind"] = ops.map({op: canonical_op(op) for op in ops.unique()})
    dur = pd.to_numeric(df["dur"], errors="coerce").fillna(0)
    df["dur_s"] = dur / NS
    # busbw again from the canonical name: the writer's factor only knows canonical spellings
    df["busbw"] = bandwidth.busbw(df["kind"], df["bytes"], dur, df["group_size"])
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
    """One row per (rank, step): `dur_s`, `start`, `end` (ns). Steps with no duration are dropped.
    Computed once per trace; callers get a copy."""
    return _step_frame(trace)


@cached
def _step_frame(trace: Trace) -> pd.DataFrame:
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
    pos = df[["rank", "step"]].reset_index(drop=True)
    nth = pos.sort_values(["rank", "step"], kind="stable").groupby("rank").cumcount().sort_index()
    first = pos["step"].where(nth == skip).groupby(pos["rank"]).transform("max")  # skip-th smallest
    return df[(pos["step"] >= first).to_numpy()]


def join_steps(trace: Trace, values: pd.Series, name: str) -> pd.DataFrame:
    """A figure indexed by (rank, step) joined to the steady steps: rank, step, dur_s and `name`
    (0.0 for a step without any)."""
    st = steady(steps(trace))[["rank", "step", "dur_s"]]
    if values.empty:
        return st.assign(**{name: 0.0})
    out = st.merge(values.rename(name).reset_index(), on=["rank", "step"], how="left")
    return out.fillna({name: 0.0})


def union_by_step(c: pd.DataFrame) -> pd.Series:
    """Seconds covered by the union of each (rank, step)'s [ts, ts + dur) intervals (nested or async
    ops count once), indexed by (rank, step)."""
    if c.empty:
        return pd.Series(dtype=float)
    ts = pd.to_numeric(c["ts"]).astype("int64")
    # offsets from the first op: epoch nanoseconds are past float64's exact integers (union_by_group
    # compares against a shifted, hence float, running end)
    rows = pd.DataFrame({"rank": c["rank"], "step": c["step"], "ts": ts - ts.min(),
                         "dur": pd.to_numeric(c["dur"]).fillna(0).astype("int64")})
    return intervals.union_by_group(rows, ["rank", "step"]) / NS


def _selected(trace: Trace, mask: pd.Series | None) -> pd.DataFrame:
    c = comms(trace)
    return c if mask is None else c[mask.reindex(c.index, fill_value=False)]


def comm_per_step(trace: Trace, mask: pd.Series | None = None) -> pd.DataFrame:
    """Seconds of (selected) communication per (rank, step), summed, joined to the step's duration."""
    c = _selected(trace, mask)
    return join_steps(trace, c.groupby(["rank", "step"], observed=True)["dur_s"].sum(), "comm_s")


def union_per_step(trace: Trace, mask: pd.Series | None = None) -> pd.DataFrame:
    """Like `comm_per_step`, but `comm_s` is the union of the ops' intervals, not their sum."""
    return join_steps(trace, union_by_step(_selected(trace, mask)), "comm_s")


def median_step_s(trace: Trace) -> float:
    st = steady(steps(trace))
    return float(st["dur_s"].median()) if not st.empty else 0.0


def by_rank(values: pd.Series, cast: type = float) -> dict[int, Any]:
    """A per-rank series as evidence: {rank: value} with plain Python numbers (JSON-ready)."""
    return {int(r): cast(v) for r, v in values.items()}


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
    """A ZeRO / fp16 setting as the job ran it: effective config, then ds_config, then code default
    (a key present but null counts as absent), so rules need no fallback of their own."""
    zc = zero_config(trace)
    for name in (key, key.removeprefix("stage3_")):  # the engine's dump uses field names, not aliases
        if zc.get(name) is not None:
            return zc[name]
    fp16 = ds_config(trace).get("fp16")
    if isinstance(fp16, dict) and fp16.get(key) is not None:
        return fp16[key]
    if key == "overlap_comm":
        return zero_stage(trace) == 3  # the code default: true only for stage 3
    return DS_DEFAULTS.get(key)


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"
