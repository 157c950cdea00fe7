"""A diag trace as a Chrome/Perfetto JSON timeline: one process per rank, one track per signal
(steps, layers) and one per process group's collectives (`collectives [dp]`), counters for device
memory, host RSS and the loss scale, and an instant marker on every step that overflowed. Open it
at ui.perfetto.dev or chrome://tracing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from diag import schema
from diag.ranks import rank_name

if TYPE_CHECKING:
    from diag.trace.model import Trace

TRACKS = {schema.STEP: (1, "steps"), schema.LAYER: (2, "layers"), schema.COMM: (3, "collectives")}
GROUP_TID0 = 10  # collectives of the n-th process group (by name) go to track GROUP_TID0 + n


def _name(kind: str, row: dict[str, Any]) -> str:
    if kind == schema.STEP:
        return f"step {row.get('step')}"
    if kind == schema.LAYER:
        return f"{row.get('module')} {row.get('phase') or ''}".strip()
    return str(row.get("op"))


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and pd.isna(value))


def _args(kind: str, row: dict[str, Any]) -> dict[str, Any]:
    keep = {
        schema.STEP: ("step", "samples", "tokens", "applied"),
        schema.LAYER: ("step", "flops", "mem_delta"),
        schema.COMM: ("step", "bytes", "dtype", "group", "group_size", "busbw", "module"),
    }[kind]
    return {k: row[k] for k in keep if k in row and _known(row[k])}


def _group(row: dict[str, Any]) -> str:
    g = row.get("group")
    return str(g) if _known(g) and str(g) != "" else "?"


def _group_tids(trace: Trace) -> dict[str, int]:
    """Process group name -> its collectives' track, the same on every rank."""
    df = trace.comms
    names = sorted({_group(r) for r in df[["group"]].astype(object).to_dict("records")}) if len(df) else []
    return {g: GROUP_TID0 + i for i, g in enumerate(names)}


def _spans(kind: str, df: pd.DataFrame, t0: int, groups: dict[str, int]) -> list[dict[str, Any]]:
    tid = TRACKS[kind][0]
    df = df.dropna(subset=["ts", "dur"])
    return [
        {
            "ph": "X",
            "pid": int(r["rank"]),
            "tid": groups[_group(r)] if kind == schema.COMM else tid,
            "name": _name(kind, r),
            "ts": (r["ts"] - t0) / 1e3,
            "dur": r["dur"] / 1e3,
            "cat": kind,
            "args": _args(kind, r),
        }
        for r in df.astype(object).to_dict("records")
    ]


def _counter(rank: int, name: str, ts: float, values: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "C", "pid": rank, "name": name, "ts": ts, "args": values}


def _memory(df: pd.DataFrame, t0: int) -> list[dict[str, Any]]:
    """Device memory (allocated / reserved, where the device allocator reports it) and the process's
    RSS, in bytes; a value the trace does not hold is left out, never drawn as 0."""
    out = []
    for r in df.dropna(subset=["ts"]).astype(object).to_dict("records"):
        ts, rank = (r["ts"] - t0) / 1e3, int(r["rank"])
        device = {k: r[k] for k in ("allocated", "reserved") if _known(r.get(k))}
        if device:
            out.append(_counter(rank, "device memory", ts, device))
        if _known(r.get("rss")):
            out.append(_counter(rank, "host RSS", ts, {"rss": r["rss"]}))
    return out


def _overflow(df: pd.DataFrame, t0: int) -> list[dict[str, Any]]:
    """The loss scale after each update (a counter), and an instant marker on the steps track of
    each step that overflowed (the optimizer step was skipped and the scale lowered)."""
    out = []
    for r in df.dropna(subset=["ts"]).astype(object).to_dict("records"):
        ts, rank = (r["ts"] - t0) / 1e3, int(r["rank"])
        if _known(r.get("scale_after")):
            out.append(_counter(rank, "loss scale", ts, {"scale": r["scale_after"]}))
        if r.get("overflow") is True:
            before, after = r.get("scale_before"), r.get("scale_after")
            scale = f": scale {before:g} -> {after:g}" if _known(before) and _known(after) else ""
            out.append(
                {
                    "ph": "i",
                    "s": "t",
                    "pid": rank,
                    "tid": TRACKS[schema.STEP][0],
                    "name": f"overflow step {r.get('step')}{scale}",
                    "ts": ts,
                    "cat": schema.OVERFLOW,
                    "args": {
                        k: r[k] for k in ("step", "scale_before", "scale_after", "source") if _known(r.get(k))
                    },
                }
            )
    return out


def _metadata(ranks: list[int], hosts: dict[int, str], groups: dict[str, int]) -> list[dict[str, Any]]:
    tracks = [(tid, label) for kind, (tid, label) in TRACKS.items() if kind != schema.COMM]
    # a role (tp, dp, pp, world) as it is; an unnamed group by its number
    tracks += [(tid, f"collectives [{'group ' * g.isdigit()}{g}]") for g, tid in groups.items()]
    out: list[dict[str, Any]] = []
    for rank in ranks:
        out.append(
            {
                "ph": "M",
                "pid": rank,
                "name": "process_name",
                "args": {"name": f"{rank_name(rank)} ({hosts.get(rank, '?')})"},
            }
        )
        out.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
        for tid, label in tracks:
            out.append({"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": label}})
            out.append(
                {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}
            )
    return out


def timeline(trace: Trace) -> dict[str, Any]:
    """The Chrome trace-event document (`traceEvents`). Timestamps are microseconds since the
    trace's first event (`otherData.origin_ns`, wall clock): epoch microseconds as doubles would
    lose sub-microsecond precision."""
    kinds = [
        k
        for k in (*TRACKS, schema.MEMORY, schema.OVERFLOW)
        if not trace.frame(k).empty and "ts" in trace.frame(k)
    ]
    t0 = int(min((trace.frame(k)["ts"].min() for k in kinds), default=0))
    groups = _group_tids(trace)
    events = _metadata(trace.ranks, trace.hosts(), groups)
    for kind in kinds:
        df = trace.frame(kind)
        if kind == schema.MEMORY:
            events += _memory(df, t0)
        elif kind == schema.OVERFLOW:
            events += _overflow(df, t0)
        else:
            events += _spans(kind, df, t0, groups)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "diag export", "sources": trace.sources, "origin_ns": t0},
    }
