"""Bus bandwidth for a whole comm frame at once: `schema.bandwidths` vectorized, so a table of
collectives costs one call of `schema.bus_factor` per distinct (op, group size), not one per row."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag import schema


def bus_factors(ops: pd.Series, group_sizes: pd.Series) -> np.ndarray:
    """nccl-tests' algbw -> busbw factor of every row (`schema.bus_factor`; a missing size counts as 0)."""
    sizes = pd.to_numeric(group_sizes, errors="coerce").fillna(0).astype("int64")
    pairs = pd.DataFrame({"op": ops.astype(str).to_numpy(), "n": sizes.to_numpy()})
    codes, uniques = pd.MultiIndex.from_frame(pairs).factorize()
    table = np.array([schema.bus_factor(op, int(n)) for op, n in uniques], dtype=float)
    return table[codes] if len(codes) else np.empty(0, float)


def busbw(ops: pd.Series, nbytes: pd.Series, dur_ns: pd.Series, group_sizes: pd.Series) -> np.ndarray:
    """Bus bandwidth (GB/s, 1e9 bytes per second) of every row, as `schema.bandwidths` gives it:
    0.0 where the duration is not positive; missing bytes or durations count as 0."""
    moved = pd.to_numeric(nbytes, errors="coerce").fillna(0).to_numpy(float)
    dur = pd.to_numeric(dur_ns, errors="coerce").fillna(0).to_numpy(float)
    alg = np.divide(moved, dur, out=np.zeros(len(dur)), where=dur > 0)
    return alg * bus_factors(ops, group_sizes)
