"""Which ranks' per-(rank, step) rows the report document keeps: every rank's up to `ROWS`
rank-steps; above, the ranks worth a look, all their steps.

Three tables have a row per rank and step (`metrics.step_times`, `throughput.per_step`,
`memory.timeline`): at 256 ranks x 2,000 steps they were 180 of the `--json` document's 278 MB
(docs/scale.md), at 1,024 x 10,000 they would be ~3.5 GB, which no one reads and few tools load.
Above `ROWS` they keep the rows of the first and the last rank, the ranks of the lowest and the
highest median step time and peak memory, and the ranks the findings name (a straggler's rows stay);
what is across every rank a step at a time is in the document's `steps` (the slowest and the
fastest rank's time, the throughput) and `memory.by_step` (the highest memory, its rank). The same
idea as the human reports' per-rank tables (`many_ranks`), where 16 ranks are the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from diag.findings import Finding

ROWS = 65_536  # rank-steps a document keeps every row of (a 64-rank job's first 1,024 steps)
FINDING_RANKS = 8  # at most this many ranks kept for the findings that name them
MEMORY = ("allocated", "reserved", "rss")


def shown(
    step_times: pd.DataFrame, memory: pd.DataFrame, findings: list[Finding], limit: int | None = None
) -> list[int] | None:
    """The ranks whose per-(rank, step) rows the document keeps; None: every rank's (at most
    `limit` rows, `ROWS` by default, in each per-(rank, step) table)."""
    if max(len(step_times), len(memory)) <= (ROWS if limit is None else limit):
        return None
    ranks = sorted({int(r) for f in (step_times, memory) if "rank" in f for r in f["rank"].unique()})
    keep = {ranks[0], ranks[-1]} if ranks else set()
    if len(step_times):
        dur = pd.to_numeric(step_times["dur_ns"], errors="coerce")
        keep |= _ends(dur.groupby(step_times["rank"]).median())
    if len(memory):
        keep |= _ends(_peaks(memory))
    named = [int(r) for f in findings for r in f.ranks if int(r) in ranks]
    keep |= set(list(dict.fromkeys(named))[:FINDING_RANKS])
    return sorted(keep)


def _peaks(memory: pd.DataFrame) -> pd.Series:
    """Each rank's highest memory: allocated where a device allocator was recorded, else RSS."""
    for col in ("allocated", "rss"):
        if col in memory:
            values = pd.to_numeric(memory[col], errors="coerce")
            if values.notna().any():
                return values.groupby(memory["rank"]).max().dropna()
    return pd.Series(dtype=float)


def _ends(per_rank: pd.Series) -> set[int]:
    """The ranks of the lowest and the highest value (the first of equals)."""
    per_rank = per_rank.dropna()
    return {int(per_rank.idxmin()), int(per_rank.idxmax())} if len(per_rank) else set()


def only(frame: pd.DataFrame, ranks: list[int] | None) -> pd.DataFrame:
    """`frame`'s rows of `ranks` (None: all, the frame itself)."""
    return frame if ranks is None or frame.empty else frame[frame["rank"].isin(ranks)]


def by_step(memory: pd.DataFrame) -> pd.DataFrame:
    """Per step, across every rank: how many ranks recorded memory, the highest allocated / reserved
    / RSS (bytes, null where no rank recorded it) and the rank of the highest allocated and RSS (the
    lowest of equals). By scatter (`ufunc.at` into a row a step), not a sort or a frame of the
    records: made at the report's end, it was the run's traced peak (+3 MiB at 256 x 500)."""
    if "step" not in memory:
        return pd.DataFrame(columns=["step", "ranks"])
    steps = pd.to_numeric(memory["step"], errors="coerce").to_numpy(dtype=float)
    ok = ~np.isnan(steps)
    if not ok.any():
        return pd.DataFrame(columns=["step", "ranks"])
    at, names = _step_places(steps[ok].astype(np.int64))
    count = np.bincount(at, minlength=len(names))
    ranks = memory["rank"].to_numpy()[ok].astype(np.int64)
    out: dict[str, np.ndarray] = {"step": names[count > 0], "ranks": count[count > 0]}
    for col in MEMORY:
        if col not in memory:
            continue
        values = pd.to_numeric(memory[col], errors="coerce").to_numpy(dtype=float)[ok]
        top = np.full(len(names), np.nan)
        np.fmax.at(top, at, values)  # fmax: a step's NaN rows do not hide its numbers
        out[f"{col}_max"] = top[count > 0]
        if col != "reserved":
            hit = values == top[at]  # never where NaN
            low = np.full(len(names), np.iinfo(np.int64).max)
            np.minimum.at(low, at[hit], ranks[hit])
            rank = pd.array(low, dtype="Int64")
            rank[np.isnan(top)] = pd.NA
            out[f"{col}_rank"] = rank[count > 0]
    return pd.DataFrame(out)


def _step_places(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's place in a row a step, and the step each place is: places are steps from the
    lowest where they are dense (no sort), else the sorted distinct steps."""
    lo, hi = int(steps.min()), int(steps.max())
    if hi - lo < 2 * len(steps):
        return steps - lo, np.arange(lo, hi + 1, dtype=np.int64)
    names, at = np.unique(steps, return_inverse=True)
    return at, names


def note(ranks: list[int] | None, of: int) -> str:
    """How a figure of per-(rank, step) rows says which ranks it shows ("" for every rank)."""
    if ranks is None:
        return ""
    return f" ({len(ranks)} of {of:,} ranks: the first, the last, the extremes and the findings')"
