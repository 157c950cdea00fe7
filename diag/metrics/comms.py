"""The collectives as the rules read them: canonical op (`kind`), seconds, bus bandwidth from the
canonical name, every op in a step; and what each step spends blocked in them.

Pure pandas on frames; `diag.metrics.stage.Metrics` computes them once per trace.
"""

from __future__ import annotations

import pandas as pd

from diag.metrics import bandwidth
from diag.metrics.steps import NS, join_steps, union_by_step
from diag.vocab import canonical_op


def comm_frame(comms: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The comm frame with a canonical `kind` column, seconds (`dur_s`) and every collective in a
    step (imported traces carry none: see `attribute_steps`; `steps` is `steps.step_frame`).
    Empty-safe."""
    df = comms.copy(deep=False)  # copy-on-write: the columns set below leave `comms` as it is
    if df.empty:
        return df.assign(kind=pd.Series(dtype=str), dur_s=pd.Series(dtype=float))
    ops = df["op"].astype(str)
    df["kind"] = ops.map({op: canonical_op(op) for op in ops.unique()})
    dur = pd.to_numeric(df["dur"], errors="coerce").fillna(0)
    df["dur_s"] = dur / NS
    # busbw again from the canonical name, for traces whose writer knew only canonical spellings
    df["busbw"] = bandwidth.busbw(df["kind"], df["bytes"], dur, df["group_size"])
    return attribute_steps(df, steps)


def attribute_steps(df: pd.DataFrame, st: pd.DataFrame) -> pd.DataFrame:
    """Imported traces (Kineto) carry step -1: give each collective the step whose span holds it."""
    step = pd.to_numeric(df["step"], errors="coerce")
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
    # sorted: only the columns the order needs (the whole frame's copy was most of a 64-rank
    # trace's peak memory)
    k = pd.DataFrame({"ts": c["ts"]}).sort_values("ts").groupby([c["rank"], key], observed=True).cumcount()
    frame = pd.DataFrame({"g": key, "k": k.reindex(c.index), "dur": pd.to_numeric(c["dur"])})
    return frame.groupby(["g", "k"])["dur"].transform("min")


def blocking_per_step(c: pd.DataFrame, steady_steps: pd.DataFrame, waits: bool) -> pd.DataFrame:
    """Blocking (async_op false) communication seconds per (rank, step) (`exposed_s`: the union of
    their intervals), joined to the steady steps; transfer time only, unless `waits` (then also the
    time spent waiting for late ranks)."""
    if c.empty or steady_steps.empty:
        return pd.DataFrame(columns=["rank", "step", "dur_s", "exposed_s"])
    # the columns the union reads: a filtered copy of the whole frame was most of the peak memory
    dur = c["dur"] if waits else transfer_dur(c)  # waiting for a straggler is not an overlap problem
    cols = pd.DataFrame({"rank": c["rank"], "step": c["step"], "ts": c["ts"], "dur": dur})
    sync = cols[~c["async_op"].fillna(False).astype(bool).to_numpy()]
    if sync.empty:
        return pd.DataFrame(columns=["rank", "step", "dur_s", "exposed_s"])
    return join_steps(steady_steps, union_by_step(sync), "exposed_s")
