"""Time a profiled step spent fetching its batch with the device idle: the DataLoader's `__next__`
host ops of a PyTorch profiler (Kineto) trace.

A Kineto step runs from one ProfilerStep to the next, so the batch's fetch is inside the step, not a
gap between steps (diag's own traces see it as that gap, `idle.gaps`). torch names the fetch
`enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` (num_workers=0: the loading itself runs
there) or `..._MultiProcessingDataLoaderIter.__next__` (waiting for the workers). What counts is the
part of it with no kernel running (a GPU rank), or all of it (a CPU rank: its host is its device);
the GPU may still be busy with the previous step's kernels while the host loads, which is no loss.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.metrics.intervals import merge
from diag.metrics.steps import NS

LOADER = "enumerate(DataLoader)#"
SINGLE = "_SingleProcessDataLoaderIter"  # num_workers=0


def is_loader(names: pd.Series) -> np.ndarray:
    """Which host ops are a DataLoader's `__next__` (the only loader ops torch names)."""
    return names.astype(str).str.startswith(LOADER).to_numpy()


def loader_idle(ops: pd.DataFrame, kernels: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Seconds of each row of `steps` (rank, start, end in ns) its rank's DataLoader `__next__` ops
    held the host while no kernel of that rank ran; 0 where a rank has none."""
    out = np.zeros(len(steps))
    if ops.empty or steps.empty or "name" not in ops:
        return out
    loads = ops[is_loader(ops["name"])]
    if loads.empty:
        return out
    by_rank = kernels.groupby("rank").indices if not kernels.empty and "rank" in kernels else {}
    base = int(steps["start"].min())  # relative times: epoch nanoseconds lose ~256 ns as float64
    for rank, rows in steps.groupby("rank").indices.items():
        mine = loads[loads["rank"] == rank]
        if mine.empty:
            continue
        a = _since(mine["ts"], base)
        b = a + mine["dur"].to_numpy(dtype=float)
        idle = b - a
        if (rows_k := by_rank.get(rank)) is not None:  # one pass over the kernels, not a mask a rank
            k = kernels.iloc[rows_k]
            ks = _since(k["ts"], base)
            ks, ke = merge(ks, ks + k["dur"].to_numpy(dtype=float))
            idle = idle - _covered(a, b, ks, ke)
        st = steps.iloc[rows]
        lo, hi = _since(st["start"], base), _since(st["end"], base)
        for i, (x, y) in enumerate(zip(lo, hi)):
            inside = (a >= x) & (a < y)  # a fetch belongs to the step it starts in
            out[rows[i]] = float(idle[inside].sum()) / NS
    return out


def single_process(ops: pd.DataFrame) -> bool | None:
    """Whether the job's loader ran in the training process (num_workers=0); None: no loader op."""
    if ops.empty or "name" not in ops:
        return None
    loads = ops["name"][is_loader(ops["name"])].astype(str)
    return None if loads.empty else bool(loads.str.contains(SINGLE).any())


def _since(ts: pd.Series, base: int) -> np.ndarray:
    """Nanoseconds after `base`, as floats (the subtraction in integers, exact)."""
    return (ts.to_numpy(dtype=np.int64) - base).astype(float)


def _covered(a: np.ndarray, b: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per interval [a, b): its length covered by the disjoint sorted intervals [starts, ends)."""
    out = np.zeros(len(a))
    for i, (x, y) in enumerate(zip(a, b)):
        j0, j1 = np.searchsorted(ends, x, "right"), np.searchsorted(starts, y, "left")
        if j1 > j0:
            out[i] = float((np.minimum(ends[j0:j1], y) - np.maximum(starts[j0:j1], x)).sum())
    return out
