"""Frames put on disk while a pass over the windows runs (issue 14, docs/scale.md).

The windowed pass's later passes read each window's records and the whole trace's steps, never
the step records' own frames (steps, memory, overflows) nor the per-(rank, step) call figures the
first pass made: held under those passes, they were ~150 of the ~440 bytes a rank-step at their
high-water mark (256 ranks x 2,000 steps). They are written to one unnamed temporary file while
the pass runs and read back after it, the same objects in the same places.
"""

from __future__ import annotations

import contextlib
import pickle
import tempfile
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np
import pandas as pd

from diag.trace.heap import release_memory


@contextlib.contextmanager
def spilled(holders: list[MutableMapping[str, Any]], keep: list[pd.DataFrame]) -> Iterator[int]:
    """Each of `holders`' frames and series out of memory while the block runs (it is given how
    many places it emptied), then back in the same mappings: one pickle, so an object two mappings
    hold is one object again. One that shares memory with `keep` (held meanwhile: a step frame
    whose columns its records' frame shares) stays: its copy read back would be held twice. Where
    the file cannot be written (no space, no temporary directory), nothing is spilled."""
    kept = [a for df in keep for a in _arrays(df)]
    out = {
        (i, key): obj
        for i, held in enumerate(holders)
        for key, obj in dict.items(held)
        if isinstance(obj, (pd.DataFrame, pd.Series)) and len(obj) and not _shares(obj, kept)
    }
    del kept
    if not out:
        yield 0
        return
    try:
        f = tempfile.TemporaryFile(prefix="diag-spill-")
    except OSError:  # (no temporary directory to write in)
        yield 0
        return
    with f:
        try:
            pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
        except (OSError, pickle.PicklingError):
            yield 0
            return
        for i, key in out:
            dict.pop(holders[i], key)
        count = len(out)
        del out
        release_memory()
        try:
            yield count
        finally:
            f.seek(0)
            for (i, key), obj in pickle.load(f).items():
                dict.__setitem__(holders[i], key, obj)


def _arrays(obj: pd.DataFrame | pd.Series) -> list[np.ndarray]:
    """The numpy arrays `obj`'s columns hold (a categorical's codes), none copied."""
    cols = [obj[c] for c in obj.columns] if isinstance(obj, pd.DataFrame) else [obj]
    out = []
    for col in cols:
        arr = col.array
        if isinstance(arr, pd.Categorical):
            out.append(arr.codes)
        elif isinstance(getattr(arr, "_ndarray", None), np.ndarray):
            out.append(arr._ndarray)
        elif isinstance(arr, np.ndarray):
            out.append(arr)
    return out


def _shares(obj: pd.DataFrame | pd.Series, kept: list[np.ndarray]) -> bool:
    """Whether one of `obj`'s arrays may share memory with one of `kept` (bounds: may, not does)."""
    return any(np.may_share_memory(a, b) for a in _arrays(obj) for b in kept)
