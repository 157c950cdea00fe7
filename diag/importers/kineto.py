"""Import one PyTorch profiler (Kineto) trace file into per-kind column frames.

kineto_events reads the `X` events into plain columns a chunk at a time; pandas does the rest
column-wise. Times become integer nanoseconds like diag's own traces. Kinds produced: `kernel` (GPU
kernels, memcpy, memset, classified, with their launch call's start and duration), `cpu_op` (host ops
and annotations), `step` (from `ProfilerStep#N`) and `comm` (see kineto_comms).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from diag import schema
from diag.importers import kineto_comms
from diag.importers.errors import ImportProblem
from diag.importers.kineto_events import BAD, read_events
from diag.importers.kineto_names import classify_kernels
from diag.metrics.input_wait import is_loader

PROBLEMS = "problems"  # header key: one-line problems with a file that was still imported


def _steps(host: pd.DataFrame, rank: int) -> pd.DataFrame:
    m = host["name"].str.extract(r"^ProfilerStep\s*#\s*(\d+)", expand=False)
    st = host[m.notna()].assign(step=m[m.notna()].astype(int)).sort_values("ts")
    return pd.DataFrame(
        {
            "rank": rank,
            "step": st["step"].to_numpy(),
            "ts": st["ts"].to_numpy(),
            "dur": st["dur"].to_numpy(),
            "samples": None,
            "tokens": None,
            "applied": True,
        }
    )


def step_of(ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The ProfilerStep number each timestamp falls in, -1 outside every step."""
    if steps.empty or len(ts) == 0:
        return np.full(len(ts), -1, dtype=np.int64)
    starts, ends = steps["ts"].to_numpy(), (steps["ts"] + steps["dur"]).to_numpy()
    i = np.searchsorted(starts, ts, side="right") - 1
    ok = (i >= 0) & (ts < ends[np.clip(i, 0, None)])
    return np.where(ok, steps["step"].to_numpy()[np.clip(i, 0, None)], -1)


def _kernels(gpu: pd.DataFrame, runtime: pd.DataFrame, steps: pd.DataFrame, rank: int) -> pd.DataFrame:
    corr = gpu["correlation"].to_numpy()
    first = ~pd.Index(runtime["correlation"].to_numpy()).duplicated()
    calls = runtime[first].set_index("correlation")[["ts", "dur"]]
    launch_ts = calls["ts"].reindex(corr).to_numpy()
    launched = ~np.isnan(launch_ts.astype(float))
    lts = np.where(launched, launch_ts, -1).astype(np.int64)
    ldur = np.where(launched, calls["dur"].reindex(corr).to_numpy(), -1).astype(np.int64)
    return (
        pd.DataFrame(
            {
                "rank": rank,
                "name": gpu["name"].astype("category"),
                "kind": classify_kernels(gpu["name"], gpu["cat"]),
                "stream": gpu["stream"],
                "ts": gpu["ts"],
                "dur": gpu["dur"],
                "correlation": corr,
                "launch_ts": lts,
                "launch_dur": ldur,
                "step": np.where(launched, step_of(lts, steps), -1),
            }
        )
        .sort_values("ts", kind="stable")
        .reset_index(drop=True)
    )


def _cpu_ops(host: pd.DataFrame, steps: pd.DataFrame, rank: int) -> pd.DataFrame:
    ts = host["ts"].to_numpy()
    return pd.DataFrame(
        {
            "rank": rank,
            "name": host["name"].astype("category"),
            "cat": host["cat"].astype("category"),
            "tid": host["tid"].astype("category"),
            "ts": ts,
            "dur": host["dur"],
            "step": step_of(ts, steps),
        }
    )


def slim_host_ops(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """`frames` with a GPU rank's host ops cut to what analysis reads of them: on a rank with
    kernels the metrics and rules read the kernels, and of the host ops (about 7 in 8 of a rank's
    rows) only the names (framework detection, in order of first appearance) and the earliest and
    latest start (the run's span, `runs`), and the DataLoader's fetches (`input_wait`: one a step).
    Kept: each name's first op, the first and the last op, every DataLoader op, in their order. A
    CPU-only rank (no kernels: its host ops are its activity) is kept whole; `diag diff`, which
    compares ops, imports without this."""
    ops, kernels = frames.get("cpu_op"), frames.get("kernel")
    if ops is None or kernels is None or kernels.empty or len(ops) < 3:
        return frames
    keep = ~ops["name"].duplicated().to_numpy() | is_loader(ops["name"])
    ts = ops["ts"].to_numpy()
    keep[[int(ts.argmin()), int(ts.argmax())]] = True
    return {**frames, "cpu_op": ops[keep].reset_index(drop=True)}


def rank_of(doc: dict[str, Any], path: str) -> int:
    """`distributedInfo.rank`, else a number in the file name (rank3, rank-00003), else 0."""
    info = doc.get("distributedInfo") or {}
    if isinstance(info.get("rank"), int):
        return int(info["rank"])
    import re

    m = re.search(r"rank[-_]?0*(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else 0


def import_file(path: str) -> tuple[int, dict[str, Any], dict[str, pd.DataFrame]]:
    """(rank, header, frames by kind) of one Kineto trace; `ImportProblem` when unreadable.

    Valid JSON can still hold events of the wrong shape (a string `ts`, a list `args`): whatever
    that breaks below is reported as one problem with this file, never a traceback."""
    try:
        return _import(path)
    except ImportProblem:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise ImportProblem(f"malformed trace events ({type(exc).__name__}: {str(exc)[:120]})") from exc


def _import(path: str) -> tuple[int, dict[str, Any], dict[str, pd.DataFrame]]:
    doc, cols = read_events(path)
    dropped = doc.pop(BAD, None)
    rank = rank_of(doc, path)
    info = doc.get("distributedInfo") or {}
    host = cols["host"].sort_values("ts", kind="stable")
    steps = _steps(host, rank)
    frames = {
        schema.STEP: steps,
        "kernel": _kernels(cols["gpu"], cols["runtime"], steps, rank),
        "cpu_op": _cpu_ops(host, steps, rank),
    }
    frames[schema.COMM] = kineto_comms.comm_frame(host, frames["kernel"], info, rank)
    frames[schema.COMM]["step"] = step_of(frames[schema.COMM]["ts"].to_numpy(), steps)
    header = {
        "rank": rank,
        "world_size": info.get("world_size"),
        "host": doc.get("host_name"),
        "backend": info.get("backend"),
        "source": "kineto",
        "path": path,
        "device_properties": doc.get("deviceProperties") or [],
    }
    if dropped:
        header[PROBLEMS] = [dropped]
    return rank, header, frames
