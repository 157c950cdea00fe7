"""Per-rank trace metrics: temporal breakdown, communication/computation overlap, per-collective
statistics and straggler ranks. Pure pandas/numpy on a `Trace`; `diag.metrics.stage.Metrics`
computes each once per trace for the rules and the report.

Definitions (docs/analyze.md) match Holistic Trace Analysis where it defines the figure:
- total = last activity end - first activity start; idle = total - |union of all activity|;
  compute = |union of compute kernels|; non-compute = total - compute - idle.
- overlap % = |union(comm) ∩ union(compute)| / |union(comm)| * 100.
- last arrival: for the k-th collective of a group in a step, the member that spent least time in
  it arrived last (the others waited for it); a rank's share is over the positions it was in.
  Only a measure: with two ranks one of them is "last" more than half the time even on a healthy
  run, so calling a rank a straggler is the straggler rule's job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diag import schema
from diag.metrics import bandwidth, intervals, positions
from diag.metrics.activity import Activities
from diag.metrics.agg import named
from diag.metrics.comms import between_ranks
from diag.metrics.steps import by_ranks, in_order
from diag.metrics.text import as_text, filled_text
from diag.vocab import COMM, COMPUTE

if TYPE_CHECKING:
    from diag.trace.model import Trace


def _union(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return intervals.merge(df["ts"].to_numpy(np.int64), df["end"].to_numpy(np.int64))


def _ranks(trace: Trace) -> list[int]:
    return sorted(set(trace.ranks) | set(trace.frame("kernel")["rank"].dropna().astype(int)))


def temporal_breakdown(trace: Trace) -> pd.DataFrame:
    """One row per rank: idle / compute / non-compute time (ns) and % of the active span."""
    rows = []
    activity = Activities(trace)
    for rank in _ranks(trace):
        act, source = activity(rank)
        if act.empty:
            continue
        every = _union(act)
        span = int(every[1][-1] - every[0][0])
        idle = span - intervals.total(*every)
        compute = intervals.total(*_union(act[act["kind"] == COMPUTE]))
        rows.append(
            {
                "rank": rank,
                "source": source,
                "total_ns": span,
                "idle_ns": idle,
                "compute_ns": compute,
                "non_compute_ns": span - compute - idle,
            }
        )
    df = pd.DataFrame(rows, columns=["rank", "source", "total_ns", "idle_ns", "compute_ns", "non_compute_ns"])
    for col in ("idle", "compute", "non_compute"):
        df[f"{col}_pct"] = (100 * df[f"{col}_ns"] / df["total_ns"].where(df["total_ns"] > 0)).round(2)
    return df


def comm_overlap(trace: Trace) -> pd.DataFrame:
    """One row per rank with collectives: % of communication time hidden under computation."""
    rows = []
    activity = Activities(trace)
    for rank in _ranks(trace):
        act, source = activity(rank)
        comm = _union(act[act["kind"] == COMM])
        if len(comm[0]) == 0:
            continue
        hidden = intervals.overlap(comm, _union(act[act["kind"] == COMPUTE]))
        rows.append({"rank": rank, "source": source, "comm_ns": intervals.total(*comm), "overlap_ns": hidden})
    df = pd.DataFrame(rows, columns=["rank", "source", "comm_ns", "overlap_ns"])
    df["overlap_pct"] = (100 * df["overlap_ns"] / df["comm_ns"].where(df["comm_ns"] > 0)).round(2)
    return df


def collective_stats(trace: Trace) -> pd.DataFrame:
    """Per rank, op and process group (its name, `tp:N`, `dp_cp:N`, ...; "" where the input names
    none): calls, time, bytes, and bandwidths (GB/s; busbw is `schema.bus_bandwidth`:
    bus bytes, each call's with its group's nccl-tests factor, over the time of the calls whose size
    is known). Sizes nothing recorded are unknown: bytes, mean and bandwidths NaN, never 0. By group:
    megatron-core's tensor-parallel all_reduces and its data-parallel gradient all_reduce are one op
    in two groups (Megatron-LM's run_simple_mcore_train_loop.py), one row of both hid which was which."""
    c = between_ranks(trace.comms)  # a rank alone in its group moves nothing
    # one rank at a time (a rank's calls are one rank's rows of the table): the columns read and
    # their groupby are one rank's, not the job's (+206 MiB for a 64-rank x 1,000-step trace)
    return stats_frame(collective_sums(c))


def collective_sums(c: pd.DataFrame, at_once: bool = False) -> pd.DataFrame | None:
    """`collective_stats`' sums per (rank, op, group) of the calls `c` (None: no call), in the
    table's order, one rank at a time (every rank `at_once`: a window's few calls); sums of two
    sets of calls add (`merge_sums`)."""
    ranks = by_ranks(c["rank"], at_once)
    parts = [_rank_stats(c.iloc[rows]) for rows in ranks] if not c.empty else []
    return pd.concat(parts, ignore_index=True) if parts else None


def merge_sums(parts: list[pd.DataFrame]) -> pd.DataFrame | None:
    """`collective_sums` of several sets of calls (a window of steps each) as one set's."""
    if len(parts) <= 1:
        return parts[0] if parts else None
    return _added(pd.concat(parts, ignore_index=True), [*_KEY, "factor"], sort=True)


_KEY = ["rank", "op", "group"]
_SUMMED = {"calls": "sum", "time_ns": "sum", "sized": "sum", "group_size": "max", "sized_ns": "sum"}


def _added(df: pd.DataFrame, key: list[str], sort: bool) -> pd.DataFrame:
    """`df`'s rows of one `key` added (the bytes: NaN where no row's size is known)."""
    g = df.groupby(key, sort=sort)
    out = named(g, **{col: (col, f) for col, f in _SUMMED.items()}).reset_index()
    out["bytes"] = g["bytes"].sum(min_count=1).to_numpy()
    if "bus_bytes" in df.columns:
        out["bus_bytes"] = g["bus_bytes"].sum(min_count=1).to_numpy()
    return out


def _bus_bytes(df: pd.DataFrame) -> pd.DataFrame:
    """The sums per (rank, op, group, bus factor) as one row per (rank, op, group), in their order,
    with the bus bytes: each factor's summed bytes times the factor. Sizes are whole bytes, so their
    sums are exact in any order and the product is rounded once: the busbw of a set of calls does
    not depend on the windows they were read in (a sum of each call's bytes x 1.9, at 20 ranks,
    differed in the last bits between a whole read and a windowed one)."""
    df = df.assign(bus_bytes=df["bytes"] * df["factor"]).drop(columns="factor")
    return df if not df.duplicated(_KEY).any() else _added(df, _KEY, sort=False)


def stats_frame(df: pd.DataFrame | None) -> pd.DataFrame:
    """`collective_stats` from its sums (`collective_sums`)."""
    if df is None:
        return pd.DataFrame(
            columns=["rank", "op", "group", "calls", "time_ns", "bytes", "mean_bytes", "algbw", "busbw"]
        )
    df = _bus_bytes(df)  # (a new frame: sums held by `windowed` stay as they are)
    df["mean_bytes"] = df["bytes"] / df["sized"].where(df["sized"] > 0)
    # bandwidths over the calls whose size is known; unknown (NaN, shown "-") when none is
    df["algbw"] = [
        schema.bus_bandwidth(b, t) if b == b else np.nan for b, t in zip(df["bytes"], df["sized_ns"])
    ]
    df["busbw"] = [
        schema.bus_bandwidth(b, t) if b == b else np.nan for b, t in zip(df["bus_bytes"], df["sized_ns"])
    ]
    return df.drop(columns=["bus_bytes", "sized", "sized_ns"])


def _rank_stats(c: pd.DataFrame) -> pd.DataFrame:
    """`collective_stats`' sums per (rank, op, group, bus factor) of calls of one rank."""
    # the columns read, first: a filter or a column set below copies only these
    group = filled_text(c["group"]) if "group" in c.columns else pd.Series("", index=c.index)
    c = c[["rank", "op", "dur", "group_size"]].assign(
        bytes=pd.to_numeric(c["bytes"], errors="coerce"), group=group
    )
    sized = c["bytes"].notna()
    c = c.assign(
        op=as_text(c["op"]),  # a categorical stays one: 843,360 calls' op as strings took 55 MiB
        factor=bandwidth.bus_factors(c["op"], c["group_size"]),
        sized_ns=c["dur"].where(sized, 0),
    )
    g = c.groupby([*_KEY, "factor"], observed=True)
    df = named(
        g,
        calls=("dur", "size"),
        time_ns=("dur", "sum"),
        sized=("bytes", "count"),
        group_size=("group_size", "max"),
        sized_ns=("sized_ns", "sum"),
    ).reset_index()
    df["op"] = df["op"].astype(str)  # one row per rank, op and group: as the strings' groupby gave it
    df["group"] = df["group"].astype(str).replace({"None": "", "nan": ""})
    df["bytes"] = g["bytes"].sum(min_count=1).to_numpy()  # NaN: no call's size is known
    return df


BY_SIZE_COLUMNS = ["op", "bytes", "busbw", "calls"]
SIZES_SCANNED = 256  # distinct message sizes up to which each size's calls are found by a scan


def bandwidth_by_size(trace: Trace) -> pd.DataFrame:
    """Median bus bandwidth per op and message size over all ranks (the bandwidth-vs-size plot).
    A trace's calls have few distinct sizes (26 (op, size) pairs in a ZeRO-3 run): each size's
    calls are found by a scan of the sizes, with no sort or groupby of every call (the groupby of
    the largest op's calls took +166 MiB at 64 ranks x 1,000 steps, the report's largest figure)."""
    return by_size(between_ranks(trace.comms))  # a rank alone in its group moves nothing


def by_size(c: pd.DataFrame) -> pd.DataFrame:
    """`bandwidth_by_size` of the calls `c`."""
    if c.empty:
        return pd.DataFrame(columns=BY_SIZE_COLUMNS)
    size = c["bytes"].to_numpy()
    codes, ops = positions.coded(as_text(c["op"]))  # ops sorted, as the groupby on (op, bytes) sorts them
    sizes = _distinct(size) if size.dtype.kind in "iuf" else None
    if sizes is None or len(sizes) > SIZES_SCANNED:
        return _by_size_groupby(c, codes, ops)
    busbw = c["busbw"].to_numpy(dtype=float, na_value=np.nan)
    found: list[tuple[int, int, float, int]] = []  # (op code, size's index, median, calls)
    for k, s in enumerate(sizes):
        same = size == s
        for i in np.flatnonzero(np.bincount(codes[same] + 1, minlength=len(ops) + 1)[1:]):
            bw = busbw[same & (codes == i)]  # a copy: the median's partition works in it
            calls = len(bw)
            if np.isnan(bw).any():  # pandas' median leaves NaN out; `calls` counts every call
                bw = bw[~np.isnan(bw)]
            found.append((int(i), k, _median(bw), calls))
    if not found:
        return pd.DataFrame(columns=BY_SIZE_COLUMNS)
    found.sort(key=lambda f: (f[0], f[1]))
    return pd.DataFrame(
        {
            "op": [str(ops[f[0]]) for f in found],
            "bytes": sizes[[f[1] for f in found]],
            "busbw": np.array([f[2] for f in found], dtype=float),
            "calls": np.array([f[3] for f in found], dtype=np.int64),
        }
    )


def _distinct(size: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """The positive sizes in `size`, sorted, a chunk at a time (`pd.unique` of every call sizes its
    hash table by the calls)."""
    seen: set[float] = set()
    for start in range(0, len(size), chunk):
        seen.update(pd.unique(size[start : start + chunk]).tolist())
    return np.sort(np.array([v for v in seen if v > 0], dtype=size.dtype))


def _median(bw: np.ndarray) -> float:
    """The median as pandas' groupby takes it (the middle value, else the mean of the two middle
    ones; NaN of none), partitioning `bw` in place."""
    n = len(bw)
    if not n:
        return np.nan
    k = n // 2
    if n % 2:
        bw.partition(k)
        return float(bw[k])
    bw.partition([k - 1, k])
    return float((bw[k] + bw[k - 1]) / 2)


def _by_size_groupby(c: pd.DataFrame, codes: np.ndarray, ops: pd.Index) -> pd.DataFrame:
    """`bandwidth_by_size` by a groupby of each op's calls (many distinct sizes: a scan a size
    would read every call once a size)."""
    keep = (c["bytes"] > 0).to_numpy()
    parts = []
    for i, op in enumerate(ops):  # one op's calls at a time: a groupby of every call took +54 MiB
        rows = np.flatnonzero((codes == i) & keep)  # at 16 ranks x 1,000 steps (its keys, order, values)
        if len(rows):
            mine = pd.DataFrame({"bytes": c["bytes"].array[rows], "busbw": c["busbw"].array[rows]})
            g = mine.groupby("bytes")
            part = named(g, busbw=("busbw", "median"), calls=("busbw", "size")).reset_index()
            part.insert(0, "op", str(op))
            parts.append(part)
    if not parts:
        return pd.DataFrame(columns=BY_SIZE_COLUMNS)
    return pd.concat(parts, ignore_index=True)


def stragglers(
    trace: Trace, c: pd.DataFrame | None = None, at: positions.Positions | None = None
) -> pd.DataFrame:
    """Per rank: the fraction of collectives it arrived last at, and its median step time. `c`:
    the trace's calls between ranks, given (`Metrics.comms` of a trace whose calls carry their
    steps) with their placement `at` (`positions.place`)."""
    c = between_ranks(trace.comms) if c is None else c  # a rank alone in its group moves nothing
    ranks = sorted(c["rank"].unique()) if not c.empty else []
    return straggler_frame(ranks, lambda: _last_arrivals(c, at), trace.steps)


def straggler_frame(ranks: list, last: Callable[[], pd.Series], steps: pd.DataFrame) -> pd.DataFrame:
    """`stragglers` of the ranks with calls (none under two), from their shares of last arrivals
    (`last()`: `arrival_shares`, taken only then) and the step records."""
    if len(ranks) < 2:
        return pd.DataFrame(columns=["rank", "last_arrival_frac", "median_step_ns"])
    steps = steps.groupby("rank")["dur"].median() if not steps.empty else pd.Series()
    df = pd.DataFrame({"rank": ranks})
    df["last_arrival_frac"] = df["rank"].map(last()).fillna(0.0).round(3)
    df["median_step_ns"] = df["rank"].map(steps)
    return df


def _last_arrivals(c: pd.DataFrame, at: positions.Positions | None = None) -> pd.Series:
    """rank -> the share of its group's calls, among those every member made with a known duration,
    at which it was the shortest, i.e. it arrived last (the lowest rank among equals). Calls are
    placed within their group and step (`positions.place`, as `comms.transfer_dur` and
    `comms.arrival_wait` place them): counted over a rank's whole trace, one call more on one rank
    (an attach lands mid-step on each rank at its own point) paired every later call with the
    wrong one."""
    return arrival_shares(arrival_counts(c, at))


ARRIVAL_COLUMNS = ["group", "need", "rank", "lasts", "seen"]


def arrival_counts(c: pd.DataFrame, at: positions.Positions | None = None) -> pd.DataFrame:
    """Per (group, rank): the positions every member (`need` of them) made with a known duration
    that the rank was in (`seen`) and arrived last at (`lasts`). Counts of two sets of steps add
    where the group's members are the same. Reductions per position with `ufunc.at`: a pivot of
    calls x ranks took +77 MiB for 843,360 calls."""
    at = positions.place(c) if at is None else at
    ids, count = at.ids, at.count
    codes, ranks = pd.factorize(c["rank"], sort=True)
    rank_codes = codes.astype(np.int32)
    del codes
    dur = pd.to_numeric(c["dur"]).to_numpy(dtype=float, na_value=np.nan)
    known = (ids >= 0) & ~np.isnan(dur)
    if not count or not known.any():
        return pd.DataFrame(columns=ARRIVAL_COLUMNS)
    group, names = positions.coded(as_text(c["group"]))
    if not known.all():  # (a finished trace's calls all are: no copies)
        ids, dur, rank_codes, group = ids[known], dur[known], rank_codes[known], group[known]
    del known
    full = np.bincount(ids, minlength=count) == at.need  # every member's duration is known
    mine = full[ids]
    least = np.full(count, np.inf)
    np.minimum.at(least, ids, dur)
    last = mine & (dur == least[ids])
    del dur
    first = np.full(count, len(ranks), np.int64)
    np.minimum.at(first, ids[last], rank_codes[last])  # the lowest rank among equals, as idxmin gives
    of = np.full(count, -1, np.int64)  # each position's group (-1: no call of it is known)
    of[ids] = group
    width = len(ranks) + 1
    lasts = np.bincount(of[full] * width + first[full], minlength=len(names) * width)
    seen = np.bincount(group[mine].astype(np.int64) * width + rank_codes[mine], minlength=len(names) * width)
    need = np.zeros(len(names), np.int64)
    need[of[of >= 0]] = at.need[of >= 0]
    lasts, seen = lasts.reshape(-1, width)[:, :-1], seen.reshape(-1, width)[:, :-1]
    g, r = np.nonzero(seen)
    return pd.DataFrame(
        {"group": names[g], "need": need[g], "rank": ranks[r], "lasts": lasts[g, r], "seen": seen[g, r]}
    )


def arrival_shares(counts: pd.DataFrame) -> pd.Series:
    """rank -> its share of last arrivals from `arrival_counts` (of one set of calls or several)."""
    if counts.empty:
        return pd.Series(dtype=float)
    per = counts.groupby("rank", sort=True)[["lasts", "seen"]].sum()
    shares = per["lasts"].to_numpy() / np.maximum(per["seen"].to_numpy(), 1)
    return pd.Series(shares, index=per.index.to_numpy())[lambda s: s > 0]


def step_times(trace: Trace, frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """rank, step, dur_ns from step events, else from the training log's iteration times. `frame`:
    the step frame of `trace.steps` (`steps.step_frame`), whose columns are shared where it holds
    the very rows kept here (each with a positive duration, in (rank, step) order: an untimed first
    step dropped from both), not copied again (32 bytes a rank-step, held for the whole analysis)."""
    s = trace.steps
    if not s.empty and "dur" in s.columns and s["dur"].notna().any():
        if frame is not None and _same_rows(s, frame):
            return frame[["rank", "step", "dur"]].rename(columns={"dur": "dur_ns"})
        return s[["rank", "step", "dur"]].rename(columns={"dur": "dur_ns"}).dropna()
    log = trace.frame("log_step")
    if "iter_ms" in log.columns and log["iter_ms"].notna().any():
        ok = log.dropna(subset=["iter_ms"])
        return pd.DataFrame(
            {"rank": ok["rank"], "step": ok["step"], "dur_ns": (ok["iter_ms"] * 1e6).round().astype("int64")}
        )
    return pd.DataFrame(columns=["rank", "step", "dur_ns"])


def _same_rows(records: pd.DataFrame, frame: pd.DataFrame) -> bool:
    """Whether `frame` (`steps.step_frame(records)`) holds the rows of `records` whose rank, step and
    dur are known, in their order, with their values: numeric durations, keys in order (so none
    sorted, none null) and as many rows as durations known (so every one positive: the frame drops
    the others)."""
    dur = records["dur"]
    if dur.dtype.kind not in "iuf" or not in_order(records["rank"], records["step"]):
        return False
    return len(frame) == int(dur.notna().sum())
