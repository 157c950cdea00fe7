"""A diag trace as a Chrome/Perfetto JSON timeline: one process per rank, one track per signal
(steps, layers, collectives) and a memory counter. Open it at ui.perfetto.dev or chrome://tracing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from diag import schema

if TYPE_CHECKING:
    from diag.trace.model import Trace

TRACKS = {schema.STEP: (1, "steps"), schema.LAYER: (2, "layers"), schema.COMM: (3, "collectives")}


def _name(kind: str, row: dict[str, Any]) -> str:
    if kind == schema.STEP:
        return f"step {row.get('step')}"
    if kind == schema.LAYER:
        return f"{row.get('module')} {row.get('phase') or ''}".strip()
    return str(row.get("op"))


def _args(kind: str, row: dict[str, Any]) -> dict[str, Any]:
    keep = {
        schema.STEP: ("step", "samples", "tokens", "applied"),
        schema.LAYER: ("step", "flops", "mem_delta"),
        schema.COMM: ("step", "bytes", "dtype", "group", "group_size", "busbw", "module"),
    }[kind]
    return {k: row[k] for k in keep if k in row and not (isinstance(row[k], float) and pd.isna(row[k]))}


def _spans(kind: str, df: pd.DataFrame, t0: int) -> list[dict[str, Any]]:
    tid = TRACKS[kind][0]
    df = df.dropna(subset=["ts", "dur"])
    return [
        {
            "ph": "X",
            "pid": int(r["rank"]),
            "tid": tid,
            "name": _name(kind, r),
            "ts": (r["ts"] - t0) / 1e3,
            "dur": r["dur"] / 1e3,
            "cat": kind,
            "args": _args(kind, r),
        }
        for r in df.astype(object).to_dict("records")
    ]


def _memory(df: pd.DataFrame, t0: int) -> list[dict[str, Any]]:
    df = df.dropna(subset=["ts"])
    return [
        {
            "ph": "C",
            "pid": int(r["rank"]),
            "name": "device memory",
            "ts": (r["ts"] - t0) / 1e3,
            "args": {"allocated": r.get("allocated") or 0, "reserved": r.get("reserved") or 0},
        }
        for r in df.astype(object).to_dict("records")
    ]


def _metadata(ranks: list[int], hosts: dict[int, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rank in ranks:
        out.append(
            {
                "ph": "M",
                "pid": rank,
                "name": "process_name",
                "args": {"name": f"rank {rank} ({hosts.get(rank, '?')})"},
            }
        )
        out.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
        out += [
            {"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": label}}
            for tid, label in TRACKS.values()
        ]
    return out


def timeline(trace: Trace) -> dict[str, Any]:
    """The Chrome trace-event document (`traceEvents`). Timestamps are microseconds since the
    trace's first event (`otherData.origin_ns`, wall clock): epoch microseconds as doubles would
    lose sub-microsecond precision."""
    kinds = [k for k in (*TRACKS, schema.MEMORY) if not trace.frame(k).empty and "ts" in trace.frame(k)]
    t0 = int(min((trace.frame(k)["ts"].min() for k in kinds), default=0))
    events = _metadata(trace.ranks, trace.hosts())
    for kind in kinds:
        df = trace.frame(kind)
        events += _memory(df, t0) if kind == schema.MEMORY else _spans(kind, df, t0)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "diag export", "sources": trace.sources, "origin_ns": t0},
    }
