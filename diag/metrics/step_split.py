"""Where a diag trace's step time goes, per rank: compute, exposed communication, other.

A diag trace has no kernel timeline (that is Kineto's, `breakdown.temporal_breakdown`), but it has
each step's span, every collective's interval and, on sampled steps, every module's forward and
backward interval. Per step, each instant goes to the first of these that holds it (`claim`, which
`diag diff`'s split uses too):
- exposed communication = the blocking (not async_op) collectives inside the step, waiting for late
  ranks included (what the rank's step loses to them; tensor-parallel groups' part of it also
  apart, `tp_ns`: blocking by Megatron's design, no overlap setting hides it), then the async
  ones (DDP's Reducer and ZeRO's overlapped reductions issue theirs from C++ and wait for them
  there) where no compute hides them;
- compute = the union of the outermost module intervals (the model's forward and backward);
- other = the rest: optimizer, data loading, host overhead, idle.
Compute is known only on sampled steps, so the split is taken over the rank's steady sampled steps
(their times include any FLOP counting); without sampled steps, over all steady steps with compute
unknown (None) and `other` holding it, and exposed communication unknown too where async
collectives ran in those steps: how much of them compute hid is not measured (it is not 0).

A rank with a GPU kernel timeline (Kineto) is split on that timeline instead ("GPU timeline"), with
the very figures the temporal breakdown, the overlap table and the exposed_comm rule use: over the
profiled span (HTA's cut), compute = the compute kernels' union, exposed communication = the
communication kernels' union not under compute, other = the rest (idle, memcpy). Host-side blocking
time means nothing there: a collective's host op returns at launch while its kernel runs on its own
stream, so one report could otherwise show two exposed-communication figures for one rank.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

from diag.metrics import intervals, positions
from diag.metrics.comms import tensor_parallel

Spans = tuple[np.ndarray, np.ndarray]  # a union of intervals: sorted disjoint (starts, ends)
EXPOSED = "exposed"

COLUMNS = [
    "rank",
    "basis",
    "steps",
    "total_ns",
    "compute_ns",
    "comm_ns",
    "other_ns",
    "compute_pct",
    "comm_pct",
    "other_pct",
    "tp_ns",
    "tp_pct",
]
TP = "tensor-parallel"


PARTS = ("total", TP, EXPOSED, "compute", "background")  # per (rank, step): `split_steps`' columns
_LABELS = PARTS[1:]  # `claim`'s order: blocking TP, other blocking, compute, then async calls
# The ranks are split `positions.CHUNK_ROWS` records (calls, module records) at a time: a rank at
# a time, the pandas work took 5-15 ms a rank (a window of one step of 256 ranks cost 256 of them);
# a chunk's ranks are split together on arrays, and the whole trace's calls are never copied at once.


def claim(parts: Iterable[tuple[str, Spans]]) -> dict[str, int]:
    """Nanoseconds per label, each instant counted once, for the first label (in `parts`' order)
    whose spans hold it: the priority that makes a step's parts sum to its time. A label may come
    more than once; labels that claim nothing are left out."""
    out: dict[str, int] = {}
    taken: Spans = (np.empty(0, np.int64), np.empty(0, np.int64))
    for label, spans in parts:
        t = intervals.total(*spans) - intervals.overlap(spans, taken)
        if t:
            out[label] = out.get(label, 0) + t
        taken = intervals.merge(np.concatenate([taken[0], spans[0]]), np.concatenate([taken[1], spans[1]]))
    return out


def split_steps(steps: pd.DataFrame, comms: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """`claim`'s parts of each of `steps` (`start`, `dur`; steps of no rank left out), from its
    rank's records clipped to its span: blocking calls (tensor-parallel groups' as TP, the others
    as EXPOSED), then compute (`layers`), then async calls as `background`. Columns rank, step
    and PARTS (int64), in `steps`' order."""
    steps = steps[steps["rank"].notna().to_numpy()]
    codes, ranks = pd.factorize(steps["rank"], sort=True)
    start = steps["start"].astype("int64").to_numpy()
    # the end in integer ns (`end` is float: an epoch-ns float is off by up to 256 ns)
    end = start + steps["dur"].astype("int64").to_numpy()
    claimed = np.zeros((len(steps), len(_LABELS)), np.int64)
    frames = [
        (df, ranks.get_indexer(df["rank"]).astype(np.int32) if len(df) else np.empty(0, np.int32))
        for df in (comms, layers)
    ]
    for lo, hi in _rank_chunks([of for _, of in frames], len(ranks)):
        rows = np.flatnonzero((codes >= lo) & (codes < hi))
        mine = [(df, of, (of >= lo) & (of < hi)) for df, of in frames]
        rank, ts, ends, label = _records(*[(_columns(df)[m], of[m]) for df, of, m in mine])
        claimed[rows] = _claimed(codes[rows], start[rows], end[rows], rank, ts, ends, label)
    out = steps[["rank", "step"]].reset_index(drop=True)
    out["total"] = end - start
    for i, name in enumerate(_LABELS):
        out[name] = claimed[:, i]
    return out


def _rank_chunks(codes: list[np.ndarray], ranks: int) -> Iterator[tuple[int, int]]:
    """(first, past the last) rank code of each chunk: ranks in order, about CHUNK_ROWS rows of
    the frames (`codes`: each row's rank code, -1 for none) a chunk; a rank is never cut."""
    rows = np.zeros(ranks, np.int64)
    for of in codes:
        rows += np.bincount(of[of >= 0], minlength=ranks)
    chunk = (np.cumsum(rows) - rows) // positions.CHUNK_ROWS
    bounds = [0, *(np.flatnonzero(np.diff(chunk)) + 1).tolist(), ranks]
    yield from itertools.pairwise(bounds) if ranks else ()


def _columns(df: pd.DataFrame) -> pd.DataFrame:
    """The columns `_records` reads (the rows then taken are a copy of those alone)."""
    return df[[c for c in ("ts", "dur", "async_op", "group") if c in df.columns]]


def _records(
    comms: tuple[pd.DataFrame, np.ndarray], layers: tuple[pd.DataFrame, np.ndarray]
) -> tuple[np.ndarray, ...]:
    """(rank code, ts, end, label: `_LABELS`' index) of the calls and module records with a time."""
    parts = []
    for (df, rank), is_comm in ((comms, True), (layers, False)):
        if not len(df):
            continue
        label = np.full(len(df), 2)  # compute
        if is_comm:
            flag = df["async_op"].astype("boolean").fillna(False).astype(bool).to_numpy()
            tp = tensor_parallel(df["group"]).to_numpy() if "group" in df else np.zeros(len(df), bool)
            label = np.where(flag, 3, np.where(tp, 0, 1))
        timed = (df["ts"].notna() & df["dur"].notna()).to_numpy()
        ts = df["ts"][timed].astype("int64").to_numpy()
        parts.append((rank[timed], ts, ts + df["dur"][timed].astype("int64").to_numpy(), label[timed]))
    if not parts:
        return tuple(np.empty(0, np.int64) for _ in range(4))
    return tuple(np.concatenate(column) for column in zip(*parts))


def _claimed(
    rank: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    of: np.ndarray,
    ts: np.ndarray,
    ends: np.ndarray,
    label: np.ndarray,
) -> np.ndarray:
    """Per step (`rank`, `start`, `end`), `claim`'s nanoseconds per label (a column each) of the
    records (`of` their rank, `ts`, `ends`, `label`) clipped to it: one sweep over every step's
    edges, each step's laid after the one before (steps may overlap), an instant going to the
    first label that holds it."""
    out = np.zeros((len(rank), len(_LABELS)), np.int64)
    step, rec = _pairs(rank, start, end, of, ts, ends)
    a, b = np.maximum(ts[rec], start[step]), np.minimum(ends[rec], end[step])
    inside = a < b
    step, rec, a, b = step[inside], rec[inside], a[inside], b[inside]
    if not len(step):
        return out
    width = np.maximum(end - start, 0) + 1
    base = (np.cumsum(width) - width)[step] - start[step]  # (a step's times from its place)
    times = np.concatenate([a + base, b + base])
    order = np.argsort(times, kind="stable")  # starts first where times tie: no count below 0
    times, owner = times[order], np.concatenate([step, step])[order]
    held = np.zeros((len(times), len(_LABELS)), np.int32)
    edge = np.where(order < len(step), 1, -1)  # a start, an end
    held[np.arange(len(times)), np.concatenate([label[rec], label[rec]])[order]] = edge
    np.cumsum(held, axis=0, out=held)
    on = held[:-1] > 0
    length = np.diff(times)
    use = on.any(axis=1) & (length > 0)
    np.add.at(out, (owner[:-1][use], on.argmax(axis=1)[use]), length[use])
    return out


def _pairs(
    rank: np.ndarray, start: np.ndarray, end: np.ndarray, of: np.ndarray, ts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(step, record) index pairs of the same rank that may overlap: per record, its rank's steps
    (by start) from the first whose running end passes its start to the last that starts before
    its end; a superset of the overlapping pairs, about one a record."""
    order = np.lexsort((start, rank))
    by_rank = rank[order]
    reach = pd.Series(end[order]).groupby(by_rank).cummax().to_numpy()
    hi = _before(by_rank, start[order], of, ends, strict=True)
    lo = _before(by_rank, reach, of, ts, strict=False)
    n = np.maximum(hi - lo, 0)
    rec = np.repeat(np.arange(len(of)), n)
    first = np.repeat(lo - (np.cumsum(n) - n), n)
    return order[first + np.arange(len(rec))], rec


def _before(rank: np.ndarray, key: np.ndarray, of: np.ndarray, at: np.ndarray, strict: bool) -> np.ndarray:
    """`np.searchsorted` by (rank, key) (rows sorted by them) of each (`of`, `at`): how many rows
    lie before it (`strict`: below it, else at or below)."""
    n = len(rank)
    query = np.concatenate([np.zeros(n, bool), np.ones(len(of), bool)])
    # at equal keys a query sorts before the rows (strict) or after them
    order = np.lexsort((~query if strict else query, np.concatenate([key, at]), np.concatenate([rank, of])))
    rows = np.cumsum(~query[order])
    out = np.empty(len(of), np.int64)
    asked = query[order]
    out[order[asked] - n] = rows[asked]
    return out


def _sampled(steps: pd.DataFrame, layers: pd.DataFrame) -> np.ndarray:
    """Per step: its rank has module records in it (a sampled step)."""
    if not len(layers):
        return np.zeros(len(steps), bool)
    keys = pd.MultiIndex.from_frame(layers[["rank", "step"]].drop_duplicates())
    return pd.MultiIndex.from_frame(steps[["rank", "step"]]).isin(keys)


def sampled_use(rank: pd.Series, sampled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the steps a rank's row reads: its `sampled` ones if it has any, else all of them; per
    step, whether its rank has sampled ones)."""
    known = pd.Series(sampled).groupby(rank.to_numpy(), dropna=False).transform("any").to_numpy(bool)
    return sampled | ~known, known


def split_rows(parts: pd.DataFrame, known: np.ndarray) -> list[dict[str, object]]:
    """One row a rank (`_rank_row`) from the parts of the steps it reads (`split_steps`' rows);
    `known`: the step is one of its rank's sampled steps, its async communication then exposed."""
    counts = parts[list(PARTS)].astype("int64")
    counts[EXPOSED] += np.where(known, counts["background"], 0)
    counts.loc[known, "background"] = 0
    by = counts.groupby(parts["rank"].to_numpy(), sort=True)
    sums, steps = by.sum(), by.size()
    is_known = pd.Series(known).groupby(parts["rank"].to_numpy(), sort=True).any()
    return [
        _rank_row(int(rank), {k: int(v) for k, v in row.items()}, int(steps[rank]), bool(is_known[rank]))
        for rank, row in zip(sums.index, sums.to_dict("records"))
    ]


def _rank_row(rank: int, sums: dict[str, int], steps: int, known: bool) -> dict[str, object]:
    """One rank's row from its `steps` steps' parts summed (`sums`: PARTS; `known`: they are its
    sampled steps, their async communication labelled exposed)."""
    total = sums["total"]
    compute = sums["compute"] if known else None
    # async collectives in steps without compute records: how much of them compute hid is unknown
    comm = None if sums["background"] else sums[EXPOSED] + sums[TP]
    other = None if comm is None else total - comm - (compute or 0)

    def pct(v: int | None) -> float | None:
        return None if v is None or not total else round(100 * v / total, 2)

    return {
        "rank": rank,
        "basis": "sampled steps" if known else "all steps",
        "steps": steps,
        "total_ns": total,
        "compute_ns": compute,
        "comm_ns": comm,
        "other_ns": other,
        "compute_pct": pct(compute),
        "comm_pct": pct(comm),
        "other_pct": pct(other),
        "tp_ns": sums[TP],
        "tp_pct": pct(sums[TP]),
    }


def _gpu_rank(rank: int, steps: int, span: pd.Series, ov: pd.DataFrame) -> dict[str, object]:
    """One rank's split on its GPU timeline (`breakdown.temporal_breakdown` / `comm_overlap` rows)."""
    total, compute = int(span["total_ns"]), int(span["compute_ns"])
    comm = int(ov["comm_ns"].iloc[0] - ov["overlap_ns"].iloc[0]) if len(ov) else 0
    other = total - compute - comm

    def pct(v: int) -> float | None:
        return round(100 * v / total, 2) if total else None

    return {
        "rank": rank,
        "basis": "GPU timeline",
        "steps": steps,
        "total_ns": total,
        "compute_ns": compute,
        "comm_ns": comm,
        "other_ns": other,
        "compute_pct": pct(compute),
        "comm_pct": pct(comm),
        "other_pct": pct(other),
        "tp_ns": None,
        "tp_pct": None,
    }


def step_split(
    steady_steps: pd.DataFrame,
    comms: pd.DataFrame,
    layers: pd.DataFrame,
    breakdown: pd.DataFrame | None = None,
    overlap: pd.DataFrame | None = None,
    step_counts: dict[int, int] | None = None,
) -> pd.DataFrame:
    """One row per rank with steady steps (`Metrics.steady_steps`, `trace.comms`, `trace.layers`);
    ranks whose `breakdown` row (`Metrics.breakdown`) comes from GPU kernels are split on that timeline
    (with `overlap`, `Metrics.overlap`; `step_counts`: profiled steps in the span per rank)."""
    gpu = breakdown[breakdown["source"] == "gpu"] if breakdown is not None and len(breakdown) else None
    gpu_ranks = set(gpu["rank"].astype(int)) if gpu is not None else set()
    rows = []
    for rank in sorted(gpu_ranks):
        ov = overlap if overlap is not None else pd.DataFrame(columns=["rank", "source"])
        ov = ov[(ov["rank"] == rank) & (ov["source"] == "gpu")]
        span = gpu[gpu["rank"] == rank].iloc[0]  # type: ignore[index]
        rows.append(_gpu_rank(rank, (step_counts or {}).get(rank, 0), span, ov))
    if not steady_steps.empty:
        st = steady_steps[steady_steps["rank"].notna().to_numpy()]
        st = st[~st["rank"].astype(int).isin(list(gpu_ranks)).to_numpy()]
        use, known = sampled_use(st["rank"], _sampled(st, layers))
        rows += split_rows(split_steps(st[use], comms, layers), known[use])
    rows.sort(key=lambda r: int(r["rank"]))  # type: ignore[call-overload]
    return pd.DataFrame(rows, columns=COLUMNS)
