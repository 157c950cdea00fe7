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

from collections.abc import Iterable

import numpy as np
import pandas as pd

from diag.metrics import intervals
from diag.metrics.activity import ByRank
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


def _inside(df: pd.DataFrame, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """The union of `df`'s [ts, end) intervals clipped to [start, end)."""
    ts = np.clip(df["ts"].to_numpy(np.int64), start, end)
    ends = np.clip(df["end"].to_numpy(np.int64), start, end)
    keep = ends > ts
    return intervals.merge(ts[keep], ends[keep]) if keep.any() else (np.empty(0, np.int64),) * 2


def _spans(df: pd.DataFrame) -> pd.DataFrame:
    d = df.dropna(subset=["ts", "dur"])
    ts = d["ts"].astype("int64")
    return pd.DataFrame({"ts": ts.to_numpy(), "end": (ts + d["dur"].astype("int64")).to_numpy()})


def per_step(
    steps: pd.DataFrame, comms: pd.DataFrame, layers: pd.DataFrame, known: bool
) -> list[dict[str, int]]:
    """`claim`'s parts of each of one rank's `steps` (blocking comm, tensor-parallel groups' as TP,
    then compute, then async comm as EXPOSED where `known`, else as `background`), with `total`."""
    flag = comms["async_op"].astype("boolean").fillna(False).astype(bool) if len(comms) else None
    flag = pd.Series(False, index=comms.index) if flag is None else flag
    tp = tensor_parallel(comms["group"]) if "group" in comms else pd.Series(False, index=comms.index)
    sync, bg, lay = _spans(comms[~flag & ~tp]), _spans(comms[flag]), _spans(layers)
    tp_sync = _spans(comms[~flag & tp])
    out = []
    # the end in integer ns (`end` is float: an epoch-ns float is off by up to 256 ns)
    starts = steps["start"].astype("int64")
    for start, end in zip(starts, starts + steps["dur"].astype("int64")):
        got = claim(
            [
                (TP, _inside(tp_sync, start, end)),
                (EXPOSED, _inside(sync, start, end)),
                ("compute", _inside(lay, start, end)),
                (EXPOSED if known else "background", _inside(bg, start, end)),
            ]
        )
        out.append({"total": int(end - start), **got})
    return out


def _sampled(steps: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    return steps[steps["step"].isin(set(layers["step"]))] if len(layers) else steps.iloc[:0]


def _rank(rank: int, steps: pd.DataFrame, comms: pd.DataFrame, layers: pd.DataFrame) -> dict[str, object]:
    sampled = _sampled(steps, layers)
    known = bool(len(sampled))
    use = sampled if known else steps
    return rank_row(rank, per_step(use, comms, layers, known), known)


def rank_row(rank: int, per: list[dict[str, int]], known: bool) -> dict[str, object]:
    """One rank's row from its steps' parts (`per_step`; `known`: they are its sampled steps,
    their async communication labelled exposed)."""
    total = sum(p["total"] for p in per)
    parts = {k: sum(p.get(k, 0) for p in per) for k in (EXPOSED, TP, "compute", "background")}
    compute = parts["compute"] if known else None
    # async collectives in steps without compute records: how much of them compute hid is unknown
    comm = None if parts["background"] else parts[EXPOSED] + parts[TP]
    other = None if comm is None else total - comm - (compute or 0)

    def pct(v: int | None) -> float | None:
        return None if v is None or not total else round(100 * v / total, 2)

    return {
        "rank": rank,
        "basis": "sampled steps" if known else "all steps",
        "steps": len(per),
        "total_ns": total,
        "compute_ns": compute,
        "comm_ns": comm,
        "other_ns": other,
        "compute_pct": pct(compute),
        "comm_pct": pct(comm),
        "other_pct": pct(other),
        "tp_ns": parts[TP],
        "tp_pct": pct(parts[TP]),
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
        mine, lay = ByRank(comms), ByRank(layers)
        rows += [
            _rank(int(rank), st, mine[rank], lay[rank] if len(layers) else layers)
            for rank, st in steady_steps.groupby("rank")
            if int(rank) not in gpu_ranks
        ]
    rows.sort(key=lambda r: int(r["rank"]))  # type: ignore[call-overload]
    return pd.DataFrame(rows, columns=COLUMNS)
