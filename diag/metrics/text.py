"""Text columns read as strings without a string per row: the per-call frames hold op, group and
module as categoricals (diag.trace.reader), and `astype(str)` on one turns 843,360 calls' group into
48 MiB of strings where the categorical takes 1 (docs/scale.md)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd


def as_text(s: pd.Series) -> pd.Series:
    """`s.astype(str)`, except a categorical of sorted strings, returned as it is: the same values
    (a missing one stays missing, as `astype(str)` keeps it), compared, grouped and sorted alike."""
    dtype = s.dtype
    if (
        isinstance(dtype, pd.CategoricalDtype)
        and not dtype.ordered
        and dtype.categories.inferred_type in ("string", "empty")
        and dtype.categories.is_monotonic_increasing
    ):
        return s
    return s.astype(str)


def map_categories(s: pd.Series, fn: Callable[[str], str]) -> pd.Series | None:
    """`s.map(fn)` as a categorical, `fn` called once per category, for a categorical of strings
    with no missing value (None otherwise: map it as strings)."""
    text = as_text(s)
    if not isinstance(text.dtype, pd.CategoricalDtype) or text.isna().any():
        return None
    old = [fn(c) for c in text.cat.categories]
    new = sorted(set(old))
    where = {v: i for i, v in enumerate(new)}
    lookup = np.array([where[v] for v in old], dtype=np.int64)
    codes = lookup[text.cat.codes.to_numpy()] if len(old) else text.cat.codes.to_numpy()
    return pd.Series(pd.Categorical.from_codes(codes, categories=pd.Index(new)), index=s.index)


def filled_text(s: pd.Series, value: str = "") -> pd.Series:
    """`as_text(s)` with each missing value `value`. A categorical gains `value` as a category, kept
    sorted as `as_text` requires (a trace whose rank files name a collective's group in one file and
    leave it null in another joins a categorical with missing values: filling one raised)."""
    text = as_text(s)
    if not text.isna().any():
        return text
    if isinstance(text.dtype, pd.CategoricalDtype):
        cats = text.cat.categories
        if value not in cats:
            text = text.cat.set_categories(sorted([*cats, value]))
        return text.fillna(value)
    return text.where(text.notna(), value)
