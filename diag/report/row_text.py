"""A table's rows as `--json`'s encoder lays them out, made a column at a time: the encoder of an
indented document is json's pure-Python one, a call per value, key and bracket, and the rows were
first made dicts of plain values (`records.plain`); at 4 ranks x 22,400 steps that was half of
`diag analyze --json`'s time. The text is the same, byte for byte; a column of any other kind of
value (a list, a timestamp) leaves the chunk to the encoder (None)."""

from __future__ import annotations

import math
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

import numpy as np
import pandas as pd

ROW, KEY = "  ", "    "  # the indents of a row and its keys in a list at depth 0 (indent 2)


def rows_text(part: pd.DataFrame) -> str | None:
    """`json.dumps(plain(part's rows as dicts), indent=2)` less its brackets' lines, or None."""
    if part.empty or part.columns.empty or not part.columns.is_unique:  # (a name twice: the dicts keep one)
        return None
    columns = []
    for name in part.columns:
        text = _column(part[name])
        if text is None:
            return None
        key = KEY + encode_basestring_ascii(str(name)) + ": "
        columns.append([key + t for t in text])
    return ",\n".join(ROW + "{\n" + ",\n".join(row) + "\n" + ROW + "}" for row in zip(*columns))


def _column(col: pd.Series) -> list[str] | None:
    """Each value's JSON text as `plain` and the encoder make it, or None for a kind not handled."""
    kind = col.dtype.kind
    if kind in "iu" and isinstance(col.dtype, np.dtype):
        return [str(v) for v in col.to_numpy().tolist()]
    if kind == "f" and isinstance(col.dtype, np.dtype):
        return [_float(v) for v in col.to_numpy().tolist()]
    if kind == "b" and isinstance(col.dtype, np.dtype):
        return ["true" if v else "false" for v in col.to_numpy().tolist()]
    if kind == "O" or isinstance(col.dtype, pd.api.extensions.ExtensionDtype):  # (nullable, category)
        out = []
        for v in col.astype(object).tolist():
            text = _value(v)
            if text is None:
                return None
            out.append(text)
        return out
    return None


def _float(v: float) -> str:
    return float.__repr__(v) if math.isfinite(v) else "null"


def _value(v: Any) -> str | None:
    """One object value: those `plain` and the encoder write as one token; None for any other."""
    if v is None or v is pd.NA or v is pd.NaT:
        return "null"
    if isinstance(v, np.generic):
        v = v.item()
    kind: Callable[[Any], str] | None = _TOKENS.get(type(v))
    return kind(v) if kind is not None else None


_TOKENS: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    bool: lambda v: "true" if v else "false",
    int: int.__repr__,
    float: _float,
}
