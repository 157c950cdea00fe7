"""The collectives as the rules read them: canonical op (`kind`), seconds, bus bandwidth from the
canonical name, every op in a step; and what each step spends blocked in them.

Pure pandas on frames; `diag.metrics.stage.Metrics` computes them once per trace.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.metrics import positions
from diag.metrics.steps import NS, join_steps, union_by_step
from diag.metrics.text import map_categories
from diag.schema import lone
from diag.vocab import canonical_op

TP_PREFIX = "tp:"  # a group the agent named tensor-parallel (its role, then its id)
SP_PREFIX = "sp:"  # sequence-parallel (DeepSpeed-Ulysses); `sp_dp:` is its gradients' group


def alone(c: pd.DataFrame) -> np.ndarray:
    """Calls a rank made alone in its group: size 1 and the recorded members that rank only (a
    ZeRO data-parallel group of one under TP = world: Megatron-DeepSpeed TP=2 ran 348 such
    all-reduces per rank, 2.6 ms a step). Nothing moves between ranks: the call's time is the
    rank's own work, not communication. A size with no recorded members (an importer's guess of
    the world size) is not taken as alone."""
    if c.empty or "group_size" not in c:
        return np.zeros(len(c), dtype=bool)
    one = np.array(pd.to_numeric(c["group_size"], errors="coerce") == 1, dtype=bool)
    if one.any() and "group_ranks" in c:
        one[one] = [lone(1, m) for m in c["group_ranks"].to_numpy()[one]]
    elif one.any():
        one[:] = False
    return one


def tensor_parallel(group: pd.Series, prefixes: tuple[str, ...] = (TP_PREFIX,)) -> pd.Series:
    """Calls in a tensor-parallel group (the agent names a group by its role: `tp:N`): a layer's
    activations, reduced where the math needs them, on the critical path by design; no bucket
    merges them and no data-parallel overlap setting hides them."""
    names = [g for g in group.dropna().unique() if str(g).startswith(prefixes)]
    return group.isin(names) if names else pd.Series(False, index=group.index)


def activations(group: pd.Series) -> pd.Series:
    """Calls that move a layer's activations: tensor-parallel groups' and DeepSpeed-Ulysses' (`sp:N`:
    the attention's q/k/v/output all-to-alls, 8 a layer a step, their count fixed by the model)."""
    return tensor_parallel(group, (TP_PREFIX, SP_PREFIX))


def between_ranks(c: pd.DataFrame) -> pd.DataFrame:
    """`c` without the calls a rank made alone in its group (`alone`): the collectives whose time
    is communication; `c` itself where there is none."""
    mine = alone(c)
    return c[~mine] if mine.any() else c


def comm_frame(comms: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The comm frame with a canonical `kind` column, seconds (`dur_s`; busbw: `bandwidth.busbw` of
    the kind, for traces whose writer knew only canonical spellings) and
    every collective in a step (imported traces carry none: see `attribute_steps`; `steps` is
    `steps.step_frame`), of the calls that reach another rank (`between_ranks`). Empty-safe."""
    df = between_ranks(comms).copy(deep=False)  # copy-on-write: the columns set below leave `comms` as it is
    if df.empty:
        return df.assign(kind=pd.Series(dtype=str), dur_s=pd.Series(dtype=float))
    kind = map_categories(df["op"], canonical_op)  # a categorical: 1 MiB, not 55, for 843,360 calls
    if kind is None:
        ops = df["op"].astype(str)
        kind = ops.map({op: canonical_op(op) for op in ops.unique()})
    df["kind"] = kind
    df["dur_s"] = pd.to_numeric(df["dur"], errors="coerce").fillna(0) / NS
    if "busbw" in df:  # the writer's, from its spelling of the op: the kind's is read instead
        del df["busbw"]
    return attribute_steps(df, steps)


def stepped(df: pd.DataFrame) -> bool:
    """Every call of `df` carries its step (a diag trace's do; imported ones carry -1): then
    `attribute_steps` leaves the frame as it is."""
    if df.empty:
        return True
    step = pd.to_numeric(df["step"], errors="coerce")
    return not (step.isna() | (step < 0)).any()


def attribute_steps(df: pd.DataFrame, st: pd.DataFrame) -> pd.DataFrame:
    """Imported traces (Kineto) carry step -1: give each collective the step whose span holds it."""
    if stepped(df) or st.empty:
        return df
    df = df.assign(ts=pd.to_numeric(df["ts"]).astype("int64")).sort_values("ts")
    spans = st[["rank", "step", "start", "end"]].rename(columns={"step": "_step"}).sort_values("start")
    m = pd.merge_asof(df.reset_index(), spans, left_on="ts", right_on="start", by="rank")
    inside = m["_step"].where(m["ts"] < m["end"])
    old = pd.to_numeric(m["step"], errors="coerce")
    m["step"] = old.where(old >= 0, inside)
    return m.set_index("index").drop(columns=["_step", "start", "end"]).dropna(subset=["step"])


def transfer_dur(c: pd.DataFrame, at: positions.Positions | None = None) -> pd.Series:
    """Each collective's duration without waiting for late ranks: the k-th op of a group takes, on
    every member, at least the transfer; the rank that arrived last waited least, so the minimum over
    the members is the transfer time (the rest is waiting for a straggler).

    NaN (unknown) where some member of the group in the trace has no k-th op yet: followed live, one
    rank's records run a step or two ahead of another's (each flushes on its own), and the minimum
    over the leader alone is its whole duration, waiting included (a healthy ZeRO-2 job's rank 1
    read "44% of each step waits on communication" live, from its first 7 steps).

    `at`: `c`'s calls placed (`positions.place`; `Metrics.placement` of `Metrics.comms`), else
    placed here."""
    if c.empty:
        return pd.Series(dtype=float)
    at = positions.place(c) if at is None else at
    ids, count = at.ids, at.count
    dur = pd.to_numeric(c["dur"])
    placed = ids >= 0
    whole = bool(placed.all())  # (the usual case: no copy of the placed calls' ids)
    out = np.full(len(c), np.nan)
    if count:
        where = ids if whole else ids[placed]
        values = dur.to_numpy(dtype=float, na_value=np.nan)
        least = np.full(count, np.nan)  # fmin skips NaN: a position of no known duration stays NaN
        np.fmin.at(least, where, values if whole else values[placed])
        del values
        calls = np.bincount(where, minlength=count)
        least[calls < at.need] = np.nan
        del calls
        out[placed] = least[where]
    if dur.dtype.kind in "iu" and not np.isnan(out).any():  # as the groupby's min of integers stays
        return pd.Series(out.astype(dur.dtype), index=c.index, name="dur")
    return pd.Series(out, index=c.index, name="dur")


def arrival_wait(c: pd.DataFrame, at: positions.Positions | None = None) -> pd.Series:
    """Each member's wait for the last to arrive at the k-th op of its group: from its own start to
    the latest start, at most its duration (ns). Where every member sees the op complete at once it
    equals `dur - transfer_dur`; unlike that, a completion one rank noticed late (it was stopped or
    descheduled when the op completed: its `dur` runs on until it resumes) is not read as that
    rank waiting for the others (a rank stopped 40 ms of every 100 ms: half of all the waiting the
    durations showed was its own stops).

    `at` as `transfer_dur`'s; calls placed by their starts as integers (a placement by float starts
    is not taken: ties may differ)."""
    if c.empty:
        return pd.Series(dtype=float)
    num = pd.to_numeric(c["ts"])
    ts = num.astype("int64")
    if at is None or num.dtype.kind not in "iu":
        at = positions.place(c, ts)
    ids, count = at.ids, at.count
    placed = ids >= 0
    whole = bool(placed.all())  # (the usual case: no copy of the placed calls' ids)
    latest = np.zeros(len(c), np.int64)
    if count:
        where = ids if whole else ids[placed]
        most = np.full(count, np.iinfo(np.int64).min)
        np.maximum.at(most, where, ts.to_numpy() if whole else ts.to_numpy()[placed])
        latest[placed] = most[where]
    # integers where every call has a position, else floats with NaN: as the groupby's max gave
    last = pd.Series(
        latest if placed.all() else np.where(placed, latest.astype(float), np.nan), index=c.index, name="ts"
    )
    return (last - ts).clip(lower=0).clip(upper=pd.to_numeric(c["dur"]).fillna(0)).astype(float)


def arrival_waits(c: pd.DataFrame, at: positions.Positions | None = None) -> pd.Series:
    """Per (rank, step) of `c`: its wait for the last to arrive (`arrival_wait`, seconds) at its
    blocking collectives and at the step's last async one; each (rank, step)'s from its own calls
    (a window of steps gives its steps'). What a stopped rank's peers waited for it, without its
    own stops read as its waiting: an op it saw complete only once resumed lasts, on its side,
    until then. `at`: as `arrival_wait`'s. Joined to the steps by `arrival_per_step`."""
    if c.empty:
        return pd.Series(dtype=float)
    flag = (
        c["async_op"].astype("boolean").fillna(False).astype(bool)
        if "async_op" in c
        else pd.Series(False, index=c.index)
    )
    wait, ts, flags = arrival_wait(c, at) / NS, pd.to_numeric(c["ts"]), flag.to_numpy()
    codes = pd.factorize(c["rank"], sort=True)[0]
    # ranks in chunks (`positions.rank_chunks`): a frame, sort and groupbys of every call took
    # +121 MiB for 843,360 calls
    sync, tail = [], []
    for rows in positions.rank_chunks(codes):
        a = pd.DataFrame(
            {
                "rank": c["rank"].iloc[rows],
                "step": c["step"].iloc[rows],
                "ts": ts.iloc[rows],
                "wait": wait.iloc[rows],
            }
        )
        mine = flags[rows]
        sync.append(a[~mine].groupby(["rank", "step"], observed=True)["wait"].sum())
        tail.append(last_per_step(a[mine], "ts", codes[rows][mine]).set_index(["rank", "step"])["wait"])
    sync, tail = [p for p in sync if len(p)], [p for p in tail if len(p)]
    if sync and tail:
        return pd.concat(sync).add(pd.concat(tail), fill_value=0.0)
    return pd.concat(sync or tail) if sync or tail else pd.Series(dtype=float)


def last_per_step(a: pd.DataFrame, key: str, codes: np.ndarray) -> pd.DataFrame:
    """Each (rank, step)'s last row of `a` by `key` (ties: the last in row order), in rank order
    (`codes`: the rows' rank codes, sorted as the ranks), then by `key`: as a stable sort by `key`
    of each rank's rows in turn gave, one sort for a chunk of ranks."""
    order = np.lexsort((a[key].to_numpy(), codes))
    return a.iloc[order].groupby(["rank", "step"], observed=True).tail(1)


def arrival_per_step(st: pd.DataFrame, waits: pd.Series) -> pd.DataFrame:
    """Per steady (rank, step) of `st`: `wait_s` (`arrival_waits`, 0.0 for a step without) and
    `compute_s`, the rest of the step."""
    if st.empty:
        return pd.DataFrame(columns=["rank", "step", "dur_s", "wait_s", "compute_s"])
    df = join_steps(st, waits, "wait_s")
    return df.assign(compute_s=(df["dur_s"] - df["wait_s"]).clip(lower=0))


def blocking_per_step(
    c: pd.DataFrame, steady_steps: pd.DataFrame, waits: bool, xfer: pd.Series | None = None
) -> pd.DataFrame:
    """Blocking (async_op false) communication seconds per (rank, step) (`exposed_s`: the union of
    their intervals), joined to the steady steps; transfer time only, unless `waits` (then also the
    time spent waiting for late ranks). `xfer`: `transfer_dur(c)` where computed already
    (`Metrics.transfer`)."""
    if c.empty or steady_steps.empty:
        return pd.DataFrame(columns=["rank", "step", "dur_s", "exposed_s"])
    parts = blocking_union(c, waits, xfer)
    return join_blocking(steady_steps, *(parts or (None, None)))


def blocking(c: pd.DataFrame) -> np.ndarray:
    """The calls a rank waits on (not `async_op`: an async call's wait is its handle's, later)."""
    return ~c["async_op"].fillna(False).astype(bool).to_numpy()


def blocking_union(
    c: pd.DataFrame, waits: bool, xfer: pd.Series | None = None, at_once: bool = False
) -> tuple[pd.Series, pd.MultiIndex | None] | None:
    """`blocking_per_step`'s figure before its join: the union's seconds per (rank, step) and the
    (rank, step)s with a blocking call whose transfer time is unknown (None: none); None where `c`
    holds no blocking call. Each (rank, step)'s from its own calls only: a window of steps gives
    its steps' (`metrics.windowed`, every rank `at_once`: `union_by_step`)."""
    if c.empty:
        return None
    if waits:
        dur = c["dur"]
    else:
        dur = transfer_dur(c) if xfer is None else xfer  # waiting for a straggler is not an overlap problem
    flag = blocking(c)
    if not flag.any():
        return None
    known = flag & dur.notna().to_numpy()
    # selected one rank at a time (`union_by_step`): a copy of every blocking call's columns was
    # this figure's peak (+55 MiB for a 16-rank x 1,000-step trace)
    values = union_by_step(c, known, dur, at_once)
    lost = flag & ~known & c["dur"].notna().to_numpy() if not waits else np.zeros(len(c), dtype=bool)
    return values, pd.MultiIndex.from_frame(c.loc[lost, ["rank", "step"]]).unique() if lost.any() else None


def join_blocking(
    steady_steps: pd.DataFrame, values: pd.Series | None, gone: pd.MultiIndex | None
) -> pd.DataFrame:
    """`blocking_union`'s figure joined to the steady steps (no blocking call: an empty frame)."""
    if values is None or steady_steps.empty:
        return pd.DataFrame(columns=["rank", "step", "dur_s", "exposed_s"])
    out = join_steps(steady_steps, values, "exposed_s")
    if gone is None or not len(gone):
        return out
    # a step with a collective whose transfer time is unknown (a member's records not in yet): NaN,
    # not its other collectives' time alone (rows stay aligned with `waits=True`'s)
    hit = pd.MultiIndex.from_frame(out[["rank", "step"]]).isin(gone)
    return out.assign(exposed_s=out["exposed_s"].mask(hit))
