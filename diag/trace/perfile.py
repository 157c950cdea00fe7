"""A diag trace's records turned into frames one rank file at a time, joined when all are read.

`reader.load_trace` once held every record of every rank as a dict until the end (about 10x the
record's row in a frame: a 64-rank x 1,000-step trace of 1 GB took 3 GB). Here each file's records
of a kind become one frame as soon as the file is read. Joining the files' frames must give what
one frame of all the records gives: where the files' dtypes for a column differ, only the mixes whose
joint dtype is certain are joined (integers and floats: float64; numbers and a file's all-missing
column: float64; strings and an all-missing column: strings; the `CATEGORICAL` columns, op, group,
module..., stay categoricals, each file's categories united and sorted as `astype("category")` sorts
one frame of them all, so a 16-rank x 1,000-step comm frame holds 119 MiB, not 297 of strings);
any other mix raises `Uneven`, and the reader reads the files again the whole way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from diag.trace.heap import release_memory
from diag.trace.model import CATEGORICAL

Finish = Callable[[str, pd.DataFrame], pd.DataFrame]
Part = tuple[pd.DataFrame, dict[str, Any]]  # a frame of one kind's records and their dtypes as read
_NUMBERS = ("int64", "float64")


class Uneven(Exception):
    """The files' columns can only be joined by reading their records together."""


class PerFile:
    """Each file's frame per kind, kept until `frames()` joins them."""

    def __init__(self) -> None:
        self.parts: dict[str, list[Part]] = {}

    def add(self, by_kind: dict[str, list[dict[str, Any]]]) -> None:
        """One file's records (by kind) -> one frame each (`part`), held small until joined."""
        for kind, rows in by_kind.items():
            if rows:
                self.parts.setdefault(kind, []).append(part(rows))
        by_kind.clear()
        release_memory()  # the file's dicts are freed: their pages back to the OS before the next

    def extend(self, parts: dict[str, list[Part]]) -> None:
        """Another `PerFile`'s frames (one file's, read in a worker: `rankfiles`) after these."""
        for kind, frames in parts.items():
            self.parts.setdefault(kind, []).extend(frames)

    def mark(self) -> dict[str, int]:
        """Where the frames added from now on begin, by kind (`rename`)."""
        return {kind: len(parts) for kind, parts in self.parts.items()}

    def rename(self, kind: str, col: str, renames: dict[str, str], mark: dict[str, int]) -> None:
        """`renames` applied to `col` of the frames of `kind` added since `mark` (a rank file read in
        chunks learns at its end that a group was renamed; its first chunks are frames by then)."""
        if not renames:
            return
        for i in range(mark.get(kind, 0), len(self.parts.get(kind, []))):
            df = self.parts[kind][i][0]
            if col in df.columns:
                was = df[col].dtype
                named = df[col].astype(object).map(lambda v: renames.get(v, v) if isinstance(v, str) else v)
                df[col] = named.astype(was if not isinstance(was, pd.CategoricalDtype) else "category")

    def frames(self, finish: Finish) -> dict[str, pd.DataFrame]:
        """Every kind's frame, as `finish` makes it from one frame of all the records."""
        out = {}
        while self.parts:
            kind, parts = self.parts.popitem()
            # the joined frame as it was before `finish` sorted it is freed before the next kind's
            # join: held, it lay under it (a 64-rank x 1,000-step trace's layer frame, 49 MiB)
            out[kind] = frame_of(kind, parts, finish)
            release_memory()
        # the files' frames are freed, but glibc keeps their pages in the heap, under the frames
        # the analysis allocates next: 332 of the 746 MiB RSS a 64-rank x 1,000-step load left
        release_memory()
        return out


def part(rows: list[dict[str, Any]]) -> Part:
    """Records of one kind -> a frame held small until joined: the kind column dropped (the
    frame's kind says it), each string column categorical and each list column's equal lists
    shared (a name or group held once, not once per record); with the dtypes they were read with.
    Raises `Uneven` where the records make no frame (`build_frames` then reports them)."""
    try:
        df = pd.DataFrame.from_records(rows).drop(columns=["k"], errors="ignore")
    except (TypeError, ValueError) as e:
        raise Uneven from e
    dtypes = dict(df.dtypes)
    for col, dtype in dtypes.items():
        text = isinstance(dtype, pd.StringDtype) or (col in CATEGORICAL and _objects(dtype))
        if text and df[col].notna().any():
            try:
                df[col] = df[col].astype("category")
            except TypeError:  # unhashable values (lists) stay objects
                pass
        if df[col].dtype == object:
            _share_lists(df, col)
    return _own_columns(df), dtypes


def frame_of(kind: str, parts: list[Part], finish: Finish) -> pd.DataFrame:
    """One kind's parts (emptied) joined into the frame `finish` makes of all their records at once."""
    dfs = [_as_read(df, dtypes) for df, dtypes in parts]
    parts.clear()
    joined = join(dfs) if len(dfs) > 1 else dfs[0]
    dfs.clear()
    try:
        return finish(kind, joined)
    except (TypeError, ValueError) as e:
        raise Uneven from e


def _own_columns(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with each column in memory of its own (`from_records` puts the columns of one dtype in
    one block), so that `join` frees each column's parts as soon as it has joined them."""
    return pd.DataFrame({col: df[col].copy() for col in df.columns}, copy=False)


def _share_lists(df: pd.DataFrame, col: str) -> None:
    """A column of lists (a collective's group_ranks: one list per record, 1,024 numbers each in
    a 1,024-rank group) with each distinct list held once; equal values, so no reader can tell."""
    values = df[col].dropna()
    if values.empty or not isinstance(values.iloc[0], list):
        return
    seen: dict[tuple[Any, ...], list[Any]] = {}
    try:
        shared = [seen.setdefault(tuple(v), v) if isinstance(v, list) else v for v in df[col]]
    except TypeError:  # lists of lists: kept as they are
        return
    df[col] = pd.Series(shared, index=df.index, dtype=object)


def _as_read(df: pd.DataFrame, dtypes: dict[str, Any]) -> pd.DataFrame:
    """A file's frame with the dtypes its records were read with, but for the `CATEGORICAL` columns
    the finished frame holds as categoricals anyway (`join` unites their categories): a column of
    free text back to its strings or objects (the same values, each distinct one still held once)."""
    for col in df.columns:
        was = df[col].dtype
        if isinstance(was, pd.CategoricalDtype) and dtypes[col] != was and col not in CATEGORICAL:
            df[col] = df[col].astype(dtypes[col])
    return df


def _objects(dtype: Any) -> bool:
    """numpy's object dtype (`is np.dtype(object)` is not: a frame sent from a worker, unpickled,
    holds another instance of it)."""
    return isinstance(dtype, np.dtype) and dtype == np.dtype(object)


def _categories(dfs: list[pd.DataFrame], col: str) -> pd.Index | None:
    """The categories one frame of every file's `col` would get from `astype("category")` (their
    values sorted), when each file's column is categorical or holds no value; None otherwise."""
    seen: dict[Any, None] = {}
    for df in dfs:
        if col not in df.columns:
            continue
        dtype = df[col].dtype
        if isinstance(dtype, pd.CategoricalDtype):
            seen.update(dict.fromkeys(dtype.categories))
        elif not (_objects(dtype) and df[col].isna().all()):
            return None
    try:
        return pd.Index(sorted(seen))
    except TypeError as e:  # values of mixed types: one reading of them all settles their order
        raise Uneven(f"column {col!r}: categories of mixed types") from e


def _unite(dfs: list[pd.DataFrame], col: str, categories: pd.Index) -> None:
    """Each file's `col` as a categorical of the same `categories`, so that `concat` keeps it one."""
    dtype = pd.CategoricalDtype(categories)
    for df in dfs:
        if col in df.columns:
            df[col] = df[col].astype(dtype)


def _bools(s: pd.Series) -> bool:
    """Only True, False or missing in the column."""
    return s.dtype == bool or all(v is None or type(v) is bool or v is np.nan for v in s)


def join(dfs: list[pd.DataFrame]) -> pd.DataFrame:
    """The files' (or windows') frames of one kind as one, with the dtypes one frame of all their
    records has: a column of no value (None) in one part takes the others' dtype (NaN among
    numbers), categories united. Raises `Uneven` where the parts' dtypes do not agree."""
    for col in CATEGORICAL:
        categories = _categories(dfs, col)
        if categories is not None and len(categories):
            _unite(dfs, col, categories)
    cols: dict[str, set[str]] = {}
    for df in dfs:
        for col in df.columns:
            dtype = df[col].dtype
            kind = str(dtype)
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
        elif known == {"category"}:
            pass  # one categorical dtype (`_unite`) in every file that holds the column
        elif known == {"bool", "object"} and all(_bools(df[col]) for df in dfs if col in df.columns):
            pass  # a flag, None in some records (async_op): objects, as one frame of them all holds
        elif len(known) > 1:
            raise Uneven(f"column {col!r}: {sorted(kinds)}")
    return _by_column(dfs) if _alike(dfs) else pd.concat(dfs, ignore_index=True)


def _alike(dfs: list[pd.DataFrame]) -> bool:
    """Every frame has the same columns, in the same order and of the same dtypes: each column of
    the join is then its parts' column joined (as `concat` joins frames)."""
    first = dfs[0].dtypes
    return all(df.dtypes.index.equals(first.index) and (df.dtypes == first).all() for df in dfs[1:])


def _by_column(dfs: list[pd.DataFrame]) -> pd.DataFrame:
    """`pd.concat(dfs, ignore_index=True)` one column at a time, each column's parts freed once
    joined (`_own_columns`) and their pages handed back (scattered between the other columns'
    parts, glibc keeps them): the whole join held the files' frames and the joined one at once,
    the load's peak (+357 MiB, twice the comm frame, at 64 ranks x 1,000 steps)."""
    out = {}
    for col in list(dfs[0].columns):
        out[col] = pd.concat([df.pop(col) for df in dfs], ignore_index=True)
        release_memory()
    return pd.DataFrame(out, copy=False)
