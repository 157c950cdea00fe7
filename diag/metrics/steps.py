"""Per-step tables: each rank's steps with their spans, the steady ones, and figures joined to them.

Pure pandas on frames, vectorized over ranks and steps; `diag.metrics.stage.Metrics` computes them
once per trace for the rules and the report.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from diag.metrics import intervals, positions

NS = 1e9  # nanoseconds per second


def step_frame(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step) of a step frame: `dur_s`, `start`, `end` (ns). Steps with no
    duration are dropped. The step records' own columns are shared with `steps` (copy-on-write),
    not copied, where no row is dropped and the rows are already in (rank, step) order, as a
    writer's are: a 256-rank x 2,000-step trace held them twice (73 of its ~600 bytes a rank-step)."""
    if steps.empty:
        return pd.DataFrame(columns=["rank", "step", "ts", "dur", "dur_s", "start", "end"])
    df = steps.copy(deep=False)
    # (a numeric column is shared, not converted: `to_numeric` copied dur and ts, 16 bytes a
    # rank-step held)
    dur, numeric = df["dur"], df["dur"].dtype.kind in "iuf"
    if not numeric:
        dur = pd.to_numeric(dur, errors="coerce")
    timed = (dur > 0).to_numpy()  # (NaN is not)
    if not timed.all():
        df = df[timed]
        dur = df["dur"] if numeric else dur[timed]
    df["dur"] = dur
    df["dur_s"] = dur / NS
    ts = df["ts"]
    df["start"] = ts if ts.dtype.kind in "iuf" else pd.to_numeric(ts)
    df["end"] = df["start"] + df["dur"]
    if not in_order(df["rank"], df["step"]):
        df = df.sort_values(["rank", "step"])
    return df.reset_index(drop=True)


def in_order(rank: pd.Series, step: pd.Series) -> bool:
    """Whether the (rank, step) keys strictly increase: the order `sort_values` gives them, whatever
    its algorithm (equal keys, whose order a quicksort may change, are sorted as before)."""
    if rank.dtype.kind not in "iu" or step.dtype.kind not in "iu":
        return False
    r, s = rank.to_numpy(), step.to_numpy()
    return bool(((r[1:] > r[:-1]) | ((r[1:] == r[:-1]) & (s[1:] > s[:-1]))).all())


def steady(df: pd.DataFrame, skip: int = 1) -> pd.DataFrame:
    """Drop each rank's first `skip` steps (warm-up) when enough steps remain."""
    if len(df) and pd.api.types.is_numeric_dtype(df["step"]):
        ranks = df["rank"].to_numpy()
        if (ranks == ranks[0]).all():  # one rank (the report's per-rank and job tables): no groupby
            if len(df) <= skip + 1:
                return df
            return df[(df["step"] >= np.sort(df["step"].to_numpy())[skip]).to_numpy()]
    if len(df) and in_order(df["rank"], df["step"]):
        return _steady_in_order(df, skip)
    if df.empty or df.groupby("rank").size().min() <= skip + 1:
        return df
    step = df["step"].reset_index(drop=True)
    return df[(step >= nth_step(df["rank"].reset_index(drop=True), step, skip)).to_numpy()]


def _steady_in_order(df: pd.DataFrame, skip: int) -> pd.DataFrame:
    """`steady` of rows in (rank, step) order (a step frame's): each rank's first `skip` rows are
    its warm-up. `nth_step`'s sort and groupbys held ~57 bytes a rank-step, the windowed pass's
    high-water mark at 256 ranks x 2,000 steps (in `idle.gaps`)."""
    starts = positions.starts_of(df["rank"].to_numpy())
    if np.diff(np.r_[starts, len(df)]).min() <= skip + 1:
        return df
    keep = np.ones(len(df), dtype=bool)
    for k in range(skip):  # (every rank has more than `skip` rows: each is its own)
        keep[starts + k] = False
    return df[keep]


STEADY_COLUMNS = ("rank", "step", "dur", "dur_s", "start", "end")  # what readers of the steady steps read


def steady_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """A step frame's (`step_frame`) steady steps (`steady`), with the columns their readers read
    (`STEADY_COLUMNS`): the copy of every step-record column (samples, tokens, applied, ts) was
    ~25 of its ~73 bytes a rank-step, held for the whole analysis."""
    return steady(frame[[c for c in STEADY_COLUMNS if c in frame.columns]])


def by_step_and_rank(df: pd.DataFrame, col: str) -> pd.DataFrame:
    """`df.pivot_table(index="step", columns="rank", values=col)`: a step x rank table of `col`.
    For rows in (rank, step) order (each key once: a step frame's), made as one grid: pivot_table's
    groupby and unstack held ~95 bytes a rank-step, the straggler rule's high-water mark at 256 ranks
    x 2,000 steps; other rows go to pivot_table itself."""
    if df.empty or not in_order(df["rank"], df["step"]):
        return df.pivot_table(index="step", columns="rank", values=col)
    steps, at_step = np.unique(df["step"].to_numpy(), return_inverse=True)
    ranks, at_rank = np.unique(df["rank"].to_numpy(), return_inverse=True)
    grid = np.full((len(steps), len(ranks)), np.nan)
    grid[at_step.ravel(), at_rank.ravel()] = df[col].to_numpy(dtype=float)
    # pivot_table's dropna: its steps and ranks of no value (none of a row's keys: only a NaN
    # value), sliced where there are some (two `dropna` copied the grid twice, the straggler rule's
    # high-water mark at 256 ranks x 2,000 steps); the grid itself is the frame's, not copied
    empty = np.isnan(grid)
    rows, cols = ~empty.all(axis=1), ~empty.all(axis=0)
    del empty
    if not (rows.all() and cols.all()):
        grid, steps, ranks = grid[np.ix_(rows, cols)], steps[rows], ranks[cols]
    return pd.DataFrame(
        grid, index=pd.Index(steps, name="step"), columns=pd.Index(ranks, name="rank"), copy=False
    )


def nth_step(rank: pd.Series, step: pd.Series, n: int) -> pd.Series:
    """Each row's rank's `n`-th smallest step (0 the first; NaN for a rank with `n` steps or
    fewer): where its warm-up of `n` steps ends. `rank` and `step` share a default index."""
    pos = pd.DataFrame({"rank": rank, "step": step})
    nth = pos.sort_values(["rank", "step"], kind="stable").groupby("rank").cumcount().sort_index()
    return step.where(nth == n).groupby(rank).transform("max")


def join_steps(steady_steps: pd.DataFrame, values: pd.Series, name: str) -> pd.DataFrame:
    """A figure indexed by (rank, step) joined to the steady steps: rank, step, dur_s and `name`
    (0.0 for a step without any)."""
    st = steady_steps[["rank", "step", "dur_s"]]
    if values.empty:
        return st.assign(**{name: 0.0})
    out = st.merge(values.rename(name).reset_index(), on=["rank", "step"], how="left")
    return out.fillna({name: 0.0})


def union_by_step(
    c: pd.DataFrame, keep: np.ndarray | None = None, dur: pd.Series | None = None, at_once: bool = False
) -> pd.Series:
    """Seconds covered by the union of each (rank, step)'s [ts, ts + dur) intervals (nested or async
    ops count once), indexed by (rank, step), of the calls `keep` selects (all) with durations
    `dur` (their own). One rank at a time, selected there: a union never crosses ranks, and the
    sort and groupbys of every rank's calls at once took +165 MiB for a 64-rank x 1,000-step
    trace's blocking collectives (a copy of the selected calls' columns, 32 bytes a call). Every
    rank at once where `at_once` (a window of a few steps: a pass per rank costs ~25 ms)."""
    if c.empty:
        return pd.Series(dtype=float)
    dur = c["dur"] if dur is None else dur
    parts = []
    for rows in by_ranks(c["rank"], at_once):
        mine, took = c.iloc[rows][["rank", "step", "ts"]], dur.iloc[rows]
        if keep is not None:
            sel = keep[rows]
            if not sel.any():
                continue
            mine, took = mine[sel], took[sel]
        parts.append(_union_of_rank(mine, took))
    return pd.concat(parts) / NS if parts else pd.Series(dtype=float)


def by_ranks(rank: pd.Series, at_once: bool = False) -> Iterable[np.ndarray | slice]:
    """The rows of each rank in turn (`positions.by_rank`), or of every rank in one where `at_once`
    (rows of no rank left out)."""
    codes = pd.factorize(rank, sort=True)[0]
    if not at_once:
        return positions.by_rank(codes)
    return [slice(None)] if (codes >= 0).all() else [np.flatnonzero(codes >= 0)]


def _union_of_rank(c: pd.DataFrame, dur: pd.Series) -> pd.Series:
    """`union_by_step` of one rank's calls (`dur`: their durations), in ns."""
    ts = pd.to_numeric(c["ts"]).astype("int64")
    # offsets from the first op: epoch nanoseconds are past float64's exact integers (union_by_group
    # compares against a shifted, hence float, running end)
    rows = pd.DataFrame(
        {
            "rank": c["rank"],
            "step": c["step"],
            "ts": ts - ts.min(),
            "dur": pd.to_numeric(dur).fillna(0).astype("int64"),
        }
    )
    return intervals.union_by_group(rows, ["rank", "step"])
