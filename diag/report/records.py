"""The report document's tables held as their frames until read: `diag analyze --json` writes a
table's rows a chunk at a time (`json_report.write`), and the other renderers read a table as a
sequence of rows made a chunk at a time as they go (`Records` is one), so the per-(rank, step)
tables are never held whole as dicts (at 64 ranks x 1,000 steps the dicts, and the copy a second
`plain` made of them, were the run's peak; at 256 x 2,000 the terminal report's `materialize`
doubled the run's peak RSS, 0.5 -> 1.0 GB: docs/scale.md). `materialize` makes the plain document
(every table its list of rows) for those that keep or compare it whole."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import pandas as pd

CHUNK = 4096  # rows made into dicts at a time


def plain(value: Any) -> Any:
    """numpy/pandas scalars -> Python, NaN -> None, recursively (a `Records` stays as it is)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


class Records(Sequence[dict[str, Any]]):
    """A table of the document: `frame`'s rows as plain dicts, made `CHUNK` rows at a time as they
    are read (iterated, indexed or sliced; each read makes them anew, none is kept)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def __len__(self) -> int:
        return len(self.frame)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for chunk in self.chunks():
            yield from chunk

    @overload
    def __getitem__(self, at: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, at: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, at: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(at, slice):
            return as_rows(self.frame.iloc[at])
        if not -len(self) <= at < len(self):
            raise IndexError(f"row {at} of {len(self)}")
        return as_rows(self.frame.iloc[[at]])[0]

    def __repr__(self) -> str:
        return f"Records({len(self)} rows)"

    def parts(self) -> Iterator[pd.DataFrame]:
        """`frame`, `CHUNK` rows at a time."""
        for start in range(0, len(self.frame), CHUNK):
            yield self.frame.iloc[start : start + CHUNK]

    def chunks(self) -> Iterator[list[dict[str, Any]]]:
        for part in self.parts():
            yield as_rows(part)

    def rows(self) -> list[dict[str, Any]]:
        return [row for chunk in self.chunks() for row in chunk]


def as_rows(part: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame's rows as plain dicts."""
    return plain(part.astype(object).to_dict("records"))


def materialize(doc: Any) -> Any:
    """`doc` with each `Records` in it (inside dicts) made into its rows: the plain document."""
    if isinstance(doc, Records):
        return doc.rows()
    if isinstance(doc, dict):
        return {k: materialize(v) for k, v in doc.items()}
    return doc


def lazy(doc: Any) -> bool:
    """Whether `doc` holds a `Records` (inside dicts): what `json_report.write` takes apart."""
    if isinstance(doc, Records):
        return True
    return isinstance(doc, dict) and any(lazy(v) for v in doc.values())
