"""Idle time before each step's work, per (rank, step): the gap after the previous step plus, on
sampled steps (per-layer records), the lead-in to the first forward, less the time spent in
collectives there. Read by idle_between_steps (an input stall) and straggler (which defers to it).

What it reads of the calls and layers is a `Reduction` (`Idle`, issue 14): a window of steps at a
time, its part the seconds per (rank, step) and, at its edges, the intervals of the rank's
collectives, so that a gap at a window's end, which the calls of both windows may cover, is their
union, not a sum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diag.metrics import input_wait, positions
from diag.metrics.steps import NS, steady

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics

_PIECES = ["rank", "step", "which", "lo", "hi"]  # which: 0 the gap after the step, 1 its lead-in


def gaps(metrics: Metrics) -> pd.DataFrame:
    """Per (rank, step): idle seconds before the step's work: the gap after the previous step's end
    plus, where per-layer records exist (sampled steps), the lead-in from the step's start (the
    previous optimizer step's end) to its first forward. Steps recorded boundary to boundary have no
    gap, so the lead-in is where a slow data loader shows; in a profiler trace, the DataLoader's
    fetch inside the step with the device idle (`input_wait`, also as `loader_s`)."""
    st = metrics.steps
    if st.empty:
        return st.assign(
            gap_s=pd.Series(dtype=float), wall_s=pd.Series(dtype=float), comm_gap_s=pd.Series(dtype=float)
        )
    st = windows(st)
    idle = metrics.reduce(Idle())
    if idle.layers:
        st = with_lead(st, idle.first)
        st["gap_s"] = st["gap_s"] + st.pop("lead").fillna(0)
        st = st[st["first"].notna()] if st["first"].notna().any() else st
    else:
        st = st.assign(lead_hi=st["start"])
        ops = metrics.trace.frame("cpu_op")
        if not ops.empty:  # a profiler trace: its steps hold the batch's fetch (`input_wait`)
            waits = input_wait.loader_idle(ops, metrics.trace.frame("kernel"), st)
            st = st.assign(gap_s=st["gap_s"] + waits, loader_s=waits)
    st = st.assign(comm_gap_s=idle.busy(st))
    return steady(st)


def windows(st: pd.DataFrame) -> pd.DataFrame:
    """The steps (`Metrics.steps`, the whole trace's) with their gap after: `gap_s`, `wall_s` and
    its window [`lo`, `hi`] (the step's end to the next one's start)."""
    nxt = st.groupby("rank")["start"].shift(-1)
    between = ((nxt - st["end"]) / NS).fillna(0).clip(lower=0)
    return st.assign(gap_s=between, wall_s=st["dur_s"] + between, lo=st["end"], hi=nxt.fillna(st["end"]))


def with_lead(st: pd.DataFrame, first: pd.Series) -> pd.DataFrame:
    """`st` with each step's first forward (`first`: ts by (rank, step)), its lead-in seconds
    (`lead`, NaN where it has none before its end) and the lead-in window's end (`lead_hi`)."""
    st = st.merge(first.rename("first").reset_index(), on=["rank", "step"], how="left")
    lead = ((st["first"] - st["start"]) / NS).where(st["first"] < st["end"]).clip(lower=0)
    return st.assign(lead=lead, lead_hi=st["first"].where(lead.notna(), st["start"]))


@dataclass(frozen=True)
class IdleParts:
    """`Idle`'s figure: whether the trace holds per-layer records; each (rank, step)'s first
    forward (ts); per (rank, step) the seconds of its gap and lead-in spent in the calls of its own
    window of steps (`seconds`: rank, step, gap, lead); as intervals (ns), the pieces of those
    calls in the idle windows at a window's edges, each rank's first step's lead-in and last step's
    gap (`pieces`: rank, step, which (0 gap, 1 lead-in), lo, hi), and each rank's calls outside
    its window's time, from its first step's start to the next window's first start (`spills`:
    rank, lo, hi). Per (rank, step) and per window: not per call."""

    layers: bool
    first: pd.Series
    seconds: pd.DataFrame
    pieces: pd.DataFrame
    spills: pd.DataFrame

    def busy(self, st: pd.DataFrame) -> np.ndarray:
        """Seconds of each row of `st` (`windows` with `lead_hi`) spent in collectives: its gap's
        plus its lead-in's (up to `lead_hi`). Another window's calls spilled into an edge's idle
        window are united with that window's pieces there; spilled past the edge step (a call
        spanning a whole step of the other window: none seen), added to its seconds."""
        gap, lead = np.zeros(len(st)), np.zeros(len(st))
        if len(self.seconds):
            base = st[["rank", "step"]].merge(self.seconds, on=["rank", "step"], how="left")
            gap, lead = base["gap"].fillna(0.0).to_numpy(), base["lead"].fillna(0.0).to_numpy()
        extra = np.zeros((2, len(st)))
        pieces = pd.concat([self.pieces, _spilled(self.spills, st)], ignore_index=True)
        if len(pieces):
            row = {key: i for i, key in enumerate(zip(st["rank"].tolist(), st["step"].tolist()))}
            cap = st["lead_hi"].to_numpy(dtype=float)
            for (rank, step, which), p in pieces.groupby(["rank", "step", "which"], sort=True):
                i = row.get((rank, step))
                if i is not None:
                    hi = p["hi"].to_numpy(dtype=float)
                    extra[which, i] = _measure(
                        p["lo"].to_numpy(dtype=float), np.minimum(hi, cap[i]) if which else hi
                    )
        return 0.0 + gap + extra[0] + lead + extra[1]


def _measure(lo: np.ndarray, hi: np.ndarray) -> float:
    """Seconds covered by the union of the intervals [lo, hi] (ns)."""
    keep = hi > lo
    if not keep.any():
        return 0.0
    order = np.argsort(lo[keep], kind="stable")
    s, e = _union(lo[keep][order], hi[keep][order])
    return float((e - s).sum()) / NS


def _spilled(spills: pd.DataFrame, st: pd.DataFrame) -> pd.DataFrame:
    """The pieces of the `spills` in the idle windows of `st`'s rows (`_PIECES`)."""
    out: list[tuple] = []
    if spills.empty:
        return pd.DataFrame(columns=_PIECES)
    mine = st.groupby("rank").indices
    for rank, sp in spills.groupby("rank"):
        rows = mine.get(rank)
        if rows is None:
            continue
        sub, steps = st.iloc[rows], st["step"].to_numpy()[rows]
        for which, (lo_col, hi_col) in enumerate((("lo", "hi"), ("start", "lead_hi"))):
            x, y = sub[lo_col].to_numpy(dtype=float), sub[hi_col].to_numpy(dtype=float)
            for a, b in zip(sp["lo"].to_numpy(dtype=float), sp["hi"].to_numpy(dtype=float)):
                lo, hi = np.maximum(x, a), np.minimum(y, b)
                out.extend((rank, steps[i], which, lo[i], hi[i]) for i in np.flatnonzero(hi > lo))
    return pd.DataFrame(out, columns=_PIECES)


@dataclass(frozen=True)
class Idle:
    """What `gaps` reads of the layers and calls (`IdleParts`): a window knows its steps' first
    forwards (min: exact) and the idle windows of every step of the whole trace (`Metrics.steps`).
    Each rank's time is cut where a window's first step starts: a window measures its steps' idle
    windows on its calls there, keeps the pieces at its edges (a gap at the windows' boundary is
    met by the calls of both) and the calls that lie in another window's time; `IdleParts.busy`
    unites them."""

    def of(self, metrics: Metrics) -> IdleParts:
        lay = metrics.trace.layers
        if lay.empty:
            first = pd.Series(dtype=float)
        else:
            fwd = lay[lay["phase"].astype(str) == "fwd"]
            first = fwd.groupby(["rank", "step"], observed=True)["ts"].min()
        st, c = metrics.steps, metrics.comms
        if st.empty or c.empty or "ts" not in c:
            return IdleParts(not lay.empty, first, *_split(c.iloc[:0], st.iloc[:0], None))
        st = with_lead(windows(st), first) if not lay.empty else windows(st).assign(lead_hi=st["start"])
        return IdleParts(not lay.empty, first, *_split(c, st, _held(metrics)))

    def merged(self, parts: list[IdleParts]) -> IdleParts:
        if len(parts) == 1:
            return parts[0]
        firsts = [p.first for p in parts if len(p.first)]
        return IdleParts(
            any(p.layers for p in parts),
            pd.concat(firsts) if firsts else parts[0].first,
            *(_rows([getattr(p, name) for p in parts]) for name in ("seconds", "pieces", "spills")),
        )


def _rows(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Windows' rows of one table, in step order."""
    rows = [f for f in frames if len(f)]
    return pd.concat(rows, ignore_index=True) if len(rows) > 1 else (rows or frames)[0]


def _held(metrics: Metrics) -> tuple[float, float] | None:
    """The steps whose calls and layers `metrics` holds (a window: within its range) as (first,
    last): a step of theirs has all its calls and layers (its first forward) here. From those
    frames, not the step marks, which a window may hold whole."""
    lo, hi = np.inf, -np.inf
    for df in (metrics.trace.layers, metrics.comms):
        if len(df) and "step" in df:
            step = (
                df["step"]
                if pd.api.types.is_numeric_dtype(df["step"])
                else pd.to_numeric(df["step"], errors="coerce")
            )
            if not step.min() >= 0:  # (steps of none: -1 or NaN)
                step = step[step >= 0]
            if len(step):
                lo, hi = min(lo, float(step.min())), max(hi, float(step.max()))
    return (lo, hi) if lo <= hi else None


def _split(
    c: pd.DataFrame, st: pd.DataFrame, held: tuple[float, float] | None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(seconds, pieces, spills) of `IdleParts` from the calls `c` of the steps `held` (`st`: the
    whole trace's steps with their idle windows: [lo, hi] after the step, [start, lead_hi] before
    its first forward). That time is communication, not an input pipeline (the premise)."""
    seconds: list[tuple] = []
    pieces: list[tuple] = []
    spills: list[tuple] = []
    if st.empty or c.empty:  # (`Idle.of` of no steps or calls: the steps without their windows)
        return _parts(seconds, pieces, spills)
    own = st["step"].between(*held).to_numpy() if held else np.zeros(len(st), dtype=bool)
    start, step = st["start"].to_numpy(dtype=float), st["step"].to_numpy()
    # numpy columns taken once, a rank's rows sliced from them: a pandas selection per rank and
    # window was most of this pass (1,536 ranks x windows: 1.9 of 2.9 s on 256 ranks x 4 steps)
    bounds = [st[col].to_numpy(dtype=float) for col in ("lo", "hi", "start", "lead_hi")]
    reach = np.maximum(st["end"].to_numpy(dtype=float), bounds[1])  # a row's time: to its gap's end
    ts, took = c["ts"].to_numpy(dtype=float), c["dur_s"].to_numpy(dtype=float)
    calls = _rows_by_rank(c)
    for rank, rows in st.groupby("rank").indices.items():
        at = calls.get(rank)
        if at is None:
            continue
        a = ts[at]
        b = a + took[at] * NS
        order = np.argsort(a)
        starts, ends = _union(a[order], b[order])
        held_rows = rows[own[rows]]
        t0 = t1 = np.inf  # the window's time for this rank: from its first step's start to the next one's
        if len(held_rows):
            f, last = held_rows[0], held_rows[-1]
            t0 = start[f] if f != rows[0] else -np.inf
            t1 = start[last + 1] if last != rows[-1] else np.inf
        before, after = starts < t0, ends > t1
        out = list(zip(starts[before], np.minimum(ends[before], t0)))
        out += list(zip(np.maximum(starts[after], t1), ends[after]))
        spills.extend((rank, s, e) for s, e in _meeting(out, start[rows], reach[rows]))
        starts, ends = np.maximum(starts, t0), np.minimum(ends, t1)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        if not len(held_rows) or not len(starts):
            continue
        got = np.zeros((2, len(held_rows)))
        for which in (0, 1):  # [lo, hi] after the step, [start, lead_hi] before its first forward
            edge = len(held_rows) - 1 if which == 0 else 0  # the last step's gap, the first's lead-in
            x, y = bounds[2 * which][held_rows], bounds[2 * which + 1][held_rows]
            j0, j1 = np.searchsorted(ends, x, "right"), np.searchsorted(starts, y, "left")
            for i in np.flatnonzero((y > x) & (j1 > j0)):
                lo = np.maximum(starts[j0[i] : j1[i]], x[i])
                hi = np.minimum(ends[j0[i] : j1[i]], y[i])
                if i == edge:
                    pieces.extend((rank, step[held_rows[i]], which, s, e) for s, e in zip(lo, hi))
                else:
                    got[which, i] = float((hi - lo).sum()) / NS
        hit = np.flatnonzero(got.any(axis=0))
        seconds.extend((rank, step[held_rows[i]], got[0, i], got[1, i]) for i in hit)
    return _parts(seconds, pieces, spills)


def _parts(
    seconds: list[tuple], pieces: list[tuple], spills: list[tuple]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """`_split`'s rows as frames."""
    return (
        pd.DataFrame(seconds, columns=["rank", "step", "gap", "lead"]),
        pd.DataFrame(pieces, columns=_PIECES),
        pd.DataFrame(spills, columns=["rank", "lo", "hi"]),
    )


def _rows_by_rank(c: pd.DataFrame) -> dict:
    """rank -> its calls' positions in `c` (`positions.by_rank`: slices where grouped by rank)."""
    codes, ranks = pd.factorize(c["rank"])
    return {ranks[codes[rows][0]]: rows for rows in positions.by_rank(codes)}


def _meeting(intervals: list[tuple], lo: np.ndarray, hi: np.ndarray) -> list[tuple]:
    """The `intervals` that meet the time of some step of a rank (from its start `lo` to `hi`, its
    end or its gap's end), where its idle windows lie: a window's calls before every step (its
    warm-up step's: no duration, no row) meet none."""
    if not intervals:
        return intervals
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])  # the rows' time, as runs sorted by start
    out = []
    for s, e in intervals:
        j = np.searchsorted(lo, e, "left")  # rows starting before the interval ends
        if j and hi[j - 1] > s:
            out.append((s, e))
    return out


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted intervals merged into disjoint ones (touching ones too): a new one begins where a
    start lies past every end before it."""
    if np.isnan(starts).any() or np.isnan(ends).any():
        return _union_loop(starts, ends)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] > np.maximum.accumulate(ends)[:-1]
    at = np.flatnonzero(new)
    return starts[at], np.maximum.reduceat(ends, at)


def _union_loop(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_union` one interval at a time (NaN compares false: as it always did)."""
    s_out, e_out = [starts[0]], [ends[0]]
    for x, y in zip(starts[1:], ends[1:]):
        if x <= e_out[-1]:
            e_out[-1] = max(e_out[-1], y)
        else:
            s_out.append(x)
            e_out.append(y)
    return np.array(s_out), np.array(e_out)
