"""Bus bandwidth for whole comm frames: `schema.bandwidths` (per call) and `schema.bus_bandwidth`
(a set of calls: summed bus bytes over summed time) vectorized, so a table of collectives costs one
call of `schema.bus_factor` per distinct (op, group size), not one per row."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag import schema


def bus_factors(ops: pd.Series, group_sizes: pd.Series) -> np.ndarray:
    """nccl-tests' algbw -> busbw factor of every row (`schema.bus_factor`; a missing size counts as 0)."""
    if len(ops) == 0:
        return np.empty(0, float)
    sizes = pd.to_numeric(group_sizes, errors="coerce").fillna(0).astype("int64").to_numpy()
    # each column coded alone, then a table of (op, size) factors looked up per row: a string per
    # row (`astype(str)`) and a sort of the pairs took +233 MiB for a 64-rank x 1,000-step trace
    op_codes, op_names = _op_codes(ops)
    n_codes, n_values = pd.factorize(sizes)
    if len(op_names) * len(n_values) <= _TABLE_CELLS:
        table = np.array([[schema.bus_factor(op, int(n)) for n in n_values] for op in op_names], dtype=float)
        return table[op_codes, n_codes]
    pair = op_codes.astype(np.int64) * len(n_values) + n_codes
    seen, codes = np.unique(pair, return_inverse=True)
    flat = np.array(
        [schema.bus_factor(op_names[p // len(n_values)], int(n_values[p % len(n_values)])) for p in seen],
        dtype=float,
    )
    return flat[codes.reshape(-1)]


_TABLE_CELLS = 100_000  # distinct ops x distinct group sizes, at most, for a whole table of factors


def _op_codes(ops: pd.Series) -> tuple[np.ndarray, list[str]]:
    """(code of each row, the names coded) of `ops.astype(str)`: a categorical's own codes (a
    missing op reads "nan", as `astype(str)` gives), else the strings factorized."""
    if isinstance(ops.dtype, pd.CategoricalDtype):
        names = [str(c) for c in ops.cat.categories] + ["nan"]
        codes = ops.cat.codes.to_numpy().astype(np.int32)  # not int64: 4 bytes a call
        return np.where(codes < 0, len(names) - 1, codes), names
    codes, uniques = pd.factorize(ops.astype(str).to_numpy())
    return codes, [str(u) for u in uniques]


def _numbers(values: pd.Series) -> np.ndarray:
    return pd.to_numeric(values, errors="coerce").fillna(0).to_numpy(float)


def _sizes(values: pd.Series) -> np.ndarray:
    """Message sizes as floats: an unknown size (None, NaN) stays NaN."""
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(float)


def algbw(nbytes: pd.Series, dur_ns: pd.Series) -> np.ndarray:
    """Algorithm bandwidth (GB/s) of every row: 0.0 where the duration is not positive; NaN where the
    size is unknown (NaN), never 0; missing durations count as 0."""
    moved, dur = _sizes(nbytes), _numbers(dur_ns)
    out = np.divide(moved, dur, out=np.zeros(len(dur)), where=dur > 0)
    out[np.isnan(moved)] = np.nan
    return out


def busbw(ops: pd.Series, nbytes: pd.Series, dur_ns: pd.Series, group_sizes: pd.Series) -> np.ndarray:
    """Bus bandwidth (GB/s, 1e9 bytes per second) of every row, as `schema.bandwidths` gives it:
    0.0 where the duration is not positive; missing bytes or durations count as 0."""
    return algbw(nbytes, dur_ns) * bus_factors(ops, group_sizes)


def bus_bytes(ops: pd.Series, nbytes: pd.Series, group_sizes: pd.Series) -> np.ndarray:
    """Every row's bytes scaled by its bus factor: what `schema.bus_bandwidth` sums (NaN: unknown)."""
    return _sizes(nbytes) * bus_factors(ops, group_sizes)


def total_busbw(comms: pd.DataFrame) -> float:
    """`schema.bus_bandwidth` of the rows of a comm frame whose size is known (columns op, bytes, dur,
    group_size); NaN when no row's size is known."""
    if comms.empty:
        return 0.0
    moved = bus_bytes(comms["op"], comms["bytes"], comms["group_size"])
    known = ~np.isnan(moved)
    if not known.any():
        return float("nan")
    return schema.bus_bandwidth(float(moved[known].sum()), float(_numbers(comms["dur"])[known].sum()))
