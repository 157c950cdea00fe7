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
    lowest of equals)."""
    steps = pd.to_numeric(memory["step"], errors="coerce") if "step" in memory else pd.Series(dtype=float)
    if steps.notna().sum() == 0:
        return pd.DataFrame(columns=["step", "ranks"])
    df = pd.DataFrame({"step": steps.to_numpy(), "rank": memory["rank"].to_numpy()})
    for col in MEMORY:
        if col in memory:
            df[col] = pd.to_numeric(memory[col], errors="coerce").to_numpy(dtype=float)
    df = df[df["step"].notna()].astype({"step": np.int64})
    counts = df.groupby("step").size()
    out = pd.DataFrame({"step": counts.index.to_numpy(), "ranks": counts.to_numpy()})
    for col in MEMORY:
        if col not in df:
            continue
        top = (
            df[df[col].notna()]
            .sort_values(["step", col, "rank"], ascending=[True, False, True], kind="stable")
            .drop_duplicates("step")
            .set_index("step")
            .reindex(counts.index)
        )
        out[f"{col}_max"] = top[col].to_numpy()
        if col != "reserved":
            out[f"{col}_rank"] = top["rank"].astype("Int64").to_numpy()
    return out


def note(ranks: list[int] | None, of: int) -> str:
    """How a figure of per-(rank, step) rows says which ranks it shows ("" for every rank)."""
    if ranks is None:
        return ""
    return f" ({len(ranks)} of {of:,} ranks: the first, the last, the extremes and the findings')"
