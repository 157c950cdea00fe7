"""A diag trace's records turned into frames one rank file at a time, joined when all are read.

`reader.load_trace` once held every record of every rank as a dict until the end (about 10x the
record's row in a frame: a 64-rank x 1,000-step trace of 1 GB took 3 GB). Here each file's records
of a kind become one frame as soon as the file is read. Joining the files' frames must give what
one frame of all the records gives: where the files' dtypes for a column differ, only the mixes whose
joint dtype is certain are joined (integers and floats: float64; numbers and a file's all-missing
column: float64; strings and an all-missing column: strings; mixed objects and categoricals of a
categorical column: objects, made categorical after);
any other mix raises `Uneven`, and the reader reads the files again the whole way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from diag.trace.model import CATEGORICAL

Finish = Callable[[str, pd.DataFrame], pd.DataFrame]
_NUMBERS = ("int64", "float64")


class Uneven(Exception):
    """The files' columns can only be joined by reading their records together."""


class PerFile:
    """Each file's frame per kind, kept until `frames()` joins them."""

    def __init__(self) -> None:
        self.parts: dict[str, list[pd.DataFrame]] = {}

    def add(self, by_kind: dict[str, list[dict[str, Any]]]) -> None:
        """One file's records (by kind) -> one frame each; string columns categorical (a repeated
        name held once, not once per record)."""
        for kind, rows in by_kind.items():
            if not rows:
                continue
            try:
                df = pd.DataFrame.from_records(rows)
            except (TypeError, ValueError) as e:
                raise Uneven from e
            for col in CATEGORICAL:
                if col in df.columns and df[col].dtype == object and df[col].notna().any():
                    try:
                        df[col] = df[col].astype("category")
                    except TypeError:  # unhashable values (lists) stay objects
                        pass
            self.parts.setdefault(kind, []).append(df)
        by_kind.clear()

    def frames(self, finish: Finish) -> dict[str, pd.DataFrame]:
        """Every kind's frame, as `finish` makes it from one frame of all the records."""
        out = {}
        while self.parts:
            kind, dfs = self.parts.popitem()
            joined = _join(dfs) if len(dfs) > 1 else _as_read(dfs[0])
            dfs.clear()
            try:
                out[kind] = finish(kind, joined)
            except (TypeError, ValueError) as e:
                raise Uneven from e
        return out


def _as_read(df: pd.DataFrame) -> pd.DataFrame:
    """A string column back to objects, as reading the records gave it."""
    for col in df.columns:
        if isinstance(df[col].dtype, pd.CategoricalDtype):
            df[col] = df[col].astype(object)
    return df


def _join(dfs: list[pd.DataFrame]) -> pd.DataFrame:
    """The files' frames of one kind as one, with the dtypes one frame of all their records has."""
    cols: dict[str, set[str]] = {}
    for df in dfs:
        for col in df.columns:
            dtype = df[col].dtype
            kind = "category" if isinstance(dtype, pd.CategoricalDtype) else str(dtype)
            if kind == "object" and df[col].isna().all():
                kind = "missing"  # no value in this file (None): takes the others' dtype
            cols.setdefault(col, set()).add(kind)
    for col, kinds in cols.items():
        known = kinds - {"missing"}
        if known and known <= set(_NUMBERS):
            if "missing" in kinds:  # None among numbers reads as NaN
                for df in dfs:
                    if col in df.columns and df[col].dtype == object:
                        df[col] = np.nan
        elif known == {"str"} and "missing" in kinds:  # strings and None: strings with NaN
            dtype = next(df[col].dtype for df in dfs if col in df.columns and df[col].dtype != object)
            for df in dfs:
                if col in df.columns and df[col].dtype == object:
                    df[col] = df[col].astype(dtype)
        elif len(known) > 1 and not (col in CATEGORICAL and known <= {"category", "object"}):
            raise Uneven(f"column {col!r}: {sorted(kinds)}")
    for df in dfs:
        _as_read(df)
    return pd.concat(dfs, ignore_index=True)
