"""Idle time before each step's work, per (rank, step): the gap after the previous step plus, on
sampled steps (per-layer records), the lead-in to the first forward, less the time spent in
collectives there. Read by idle_between_steps (an input stall) and straggler (which defers to it).

What it reads of the calls and layers is a `Reduction` (`Idle`, issue 14): a window of steps at a
time, its part the seconds per (rank, step) and, at its edges, the intervals of the rank's
collectives, so that a gap at a window's end, which the calls of both windows may cover, is their
union, not a sum."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from diag.metrics import input_wait, positions
from diag.metrics.row_keys import RowKeys
from diag.metrics.steps import NS, steady

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics

_PIECES = ["rank", "step", "which", "lo", "hi"]  # which: 0 the gap after the step, 1 its lead-in
_WINDOWS = (("lo", "hi"), ("start", "lead_hi"))  # the gap after a step, its lead-in: (lo, hi)
_STEP_COLUMNS = ("rank", "step", "dur_s", "start", "end")  # what `gaps` reads of the step frame
_GAPS = ("rank", "step", "gap_s", "wall_s", "comm_gap_s", "first", "loader_s")  # what it gives
SPILL_PAIRS = 1 << 13  # (spill, row) pairs `_spilled` holds at once: ~1 MB of temporaries


def gaps(metrics: Metrics) -> pd.DataFrame:
    """Per (rank, step): idle seconds before the step's work: the gap after the previous step's end
    plus, where per-layer records exist (sampled steps), the lead-in from the step's start (the
    previous optimizer step's end) to its first forward. Steps recorded boundary to boundary have no
    gap, so the lead-in is where a slow data loader shows; in a profiler trace, the DataLoader's
    fetch inside the step with the device idle (`input_wait`, also as `loader_s`). Columns: rank,
    step, `gap_s`, `wall_s` (the step and its gap), `comm_gap_s` (collectives' seconds in them),
    `first` (a sampled step's first forward, ts) and `loader_s` where they apply."""
    st = metrics.steps
    if st.empty:
        return st.assign(
            gap_s=pd.Series(dtype=float), wall_s=pd.Series(dtype=float), comm_gap_s=pd.Series(dtype=float)
        )
    # (the columns read here and by its callers: the merge and the masks below copy every column
    # they are given, ~130 bytes a rank-step of the step records' at 256 ranks x 2,000 steps)
    st = windows(st[[c for c in _STEP_COLUMNS if c in st.columns]])
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
    # (what its readers read: `steady` copies every column it is given, 96 bytes a rank-step with
    # the windows' own, the windowed pass's high-water mark at 256 ranks x 2,000 steps; the
    # frame rebound first, so that the windows' own columns are gone before the copy)
    st = st[[c for c in _GAPS if c in st.columns]]
    return steady(st)


def windows(st: pd.DataFrame) -> pd.DataFrame:
    """The steps (`Metrics.steps`, the whole trace's) with their gap after: `gap_s`, `wall_s` and
    its window [`lo`, `hi`] (the step's end to the next one's start)."""
    nxt = _next_start(st)
    between = ((nxt - st["end"]) / NS).fillna(0).clip(lower=0)
    return st.assign(gap_s=between, wall_s=st["dur_s"] + between, lo=st["end"], hi=nxt.fillna(st["end"]))


def _next_start(st: pd.DataFrame) -> pd.Series:
    """Each step's rank's next step's start (NaN for its last)."""
    return st.groupby("rank")["start"].shift(-1)


def with_lead(st: pd.DataFrame, first: pd.Series) -> pd.DataFrame:
    """`st` with each step's first forward (`first`: ts by (rank, step)), its lead-in seconds
    (`lead`, NaN where it has none before its end) and the lead-in window's end (`lead_hi`)."""
    at = _first_at(st, first)
    st = st.assign(first=at).reset_index(drop=True)  # (a merge copied every column)
    lead = ((st["first"] - st["start"]) / NS).where(st["first"] < st["end"]).clip(lower=0)
    return st.assign(lead=lead, lead_hi=_lead_end(st, at))


def _first_at(st: pd.DataFrame, first: pd.Series) -> np.ndarray:
    """Each step's first forward (`first`: ts by (rank, step)), NaN where it has none."""
    keys = first.index
    return RowKeys(st).values(pd.Series(keys.get_level_values(0)), pd.Series(keys.get_level_values(1)), first)


def _lead_end(st: pd.DataFrame, at: np.ndarray) -> np.ndarray:
    """The lead-in window's end (`lead_hi`): the step's first forward (`at`, `_first_at`) where it
    lies before the step's end, else the step's start (`with_lead`'s, and `Idle.of`'s every window)."""
    return np.where(at < st["end"].to_numpy(), at, st["start"].to_numpy())


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
        rows = RowKeys(st)
        extra = self._spilled_seconds(st, rows)
        # 0 + gap + extra gap + lead + extra lead, in that order (the same sums to the bit), each
        # part made once the others are added: gap, lead and the spills' arrays all held at once were
        # ~25 MiB of the windowed pass's high-water mark at 256 ranks x 2,000 steps
        out = np.zeros(len(st))
        sec = self.seconds
        for col, more in (("gap", 0), ("lead", 1)):
            if len(sec):
                out += rows.values(sec["rank"], sec["step"], sec[col], 0.0)
            if extra is not None:
                out += extra[more]
        return out

    def _spilled_seconds(self, st: pd.DataFrame, rows: RowKeys) -> np.ndarray | None:
        """Per row of `st`, the seconds of the pieces and spills in its gap (row 0) and lead-in (row
        1), each (rank, step, which)'s united; None where there are none."""
        extra = None
        if len(st) and (len(self.pieces) or len(self.spills)):
            row, which, lo, hi = _spilled(self.spills, st)
            at = np.concatenate((rows.at(self.pieces["rank"], self.pieces["step"]), rows.last(row)))
            which = np.concatenate((self.pieces["which"].to_numpy(dtype=np.int64), which))
            lo = np.concatenate((self.pieces["lo"].to_numpy(dtype=float), lo))
            hi = np.concatenate((self.pieces["hi"].to_numpy(dtype=float), hi))
            hi = np.where(
                which == 1, np.minimum(hi, st["lead_hi"].to_numpy(dtype=float)[np.maximum(at, 0)]), hi
            )
            keep = (at >= 0) & (hi > lo)
            if keep.any():  # each (rank, step, which)'s pieces united: one sort of them all
                us, ue, uk = _unions(which[keep] * len(st) + at[keep], lo[keep], hi[keep])
                extra = (_sums(uk, ue - us, 2 * len(st)) / NS).reshape(2, len(st))
        return extra


def _spilled(spills: pd.DataFrame, st: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """The pieces of the `spills` in the idle windows of `st`'s rows: each one's row of `st`, which
    window (0 the gap, 1 the lead-in), lo and hi, in no order (`busy` sorts them). Every spill
    against each row of its rank, vectorized in chunks of about `SPILL_PAIRS` pairs: a loop a rank,
    window and spill, its pieces as tuples, took 0.87 CPU s and +3.9 MiB of `gaps`' at 256 ranks x
    16 steps windowed (65,024 spills), this 0.03 s and +0.9; at 256 x 64 (325,120), 4.04 s and +18.2
    MiB, this 0.09 s and +1.7."""
    none = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0)
    ranks = pd.Index(st["rank"].dropna().unique()).sort_values()  # st.groupby("rank")'s keys
    if spills.empty or ranks.empty:
        return none
    code = ranks.get_indexer(st["rank"])
    order = np.argsort(code, kind="stable")
    order = order[code[order] >= 0]  # each rank's rows, in row order
    count = np.bincount(code[code >= 0], minlength=len(ranks))
    first = np.cumsum(count) - count
    cols = [(st[x].to_numpy(dtype=float), st[y].to_numpy(dtype=float)) for x, y in _WINDOWS]
    rank, lo, hi = spills["rank"], spills["lo"].to_numpy(dtype=float), spills["hi"].to_numpy(dtype=float)
    got: list[tuple[np.ndarray, ...]] = []
    for s0 in range(0, len(spills), SPILL_PAIRS):  # (a block of spills: its temporaries bounded too)
        own = ranks.get_indexer(rank.iloc[s0 : s0 + SPILL_PAIRS])
        n = np.append(count, 0)[own]  # the rows of its rank each spill meets (of a rank not in st: none)
        a, b = lo[s0 : s0 + SPILL_PAIRS], hi[s0 : s0 + SPILL_PAIRS]
        cut = np.flatnonzero(np.diff((np.cumsum(n) - n) // SPILL_PAIRS)) + 1
        for j in itertools.pairwise([0, *cut.tolist(), len(n)]):
            i = slice(*j)
            row = order[np.repeat(first[own[i]], n[i]) + _within(n[i])]
            got.extend(_spill_pairs(cols, row, n[i], a[i], b[i]))
    return tuple(np.concatenate([g[k] for g in got]) for k in range(4)) if got else none


def _within(n: np.ndarray) -> np.ndarray:
    """0..n-1 of each run of `n` in turn."""
    return np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)


def _spill_pairs(
    cols: list[tuple[np.ndarray, np.ndarray]],
    row: np.ndarray,
    n: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
) -> list[tuple[np.ndarray, ...]]:
    """`_spilled`'s pieces of a chunk of spills ([a, b]), each against the `n` rows of its rank
    (`row`, in turn): row, which, lo, hi."""
    spill = np.repeat(np.arange(len(n)), n)
    out = []
    for which, (x, y) in enumerate(cols):
        lo, hi = np.maximum(x[row], a[spill]), np.minimum(y[row], b[spill])
        hit = hi > lo
        out.append((row[hit], np.full(int(hit.sum()), which), lo[hit], hi[hit]))
    return out


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
            return IdleParts(not lay.empty, first, *_split(c.iloc[:0], st.iloc[:0], None, {}))
        # (the step frame's columns and the three windows' bounds it reads, not `windows` and
        # `with_lead`'s frames: every window of pass 2 reads every step of the trace)
        end = st["end"]
        cols = {
            "start": st["start"],
            "end": end,
            "lo": end,
            "hi": _next_start(st).fillna(end),
            "lead_hi": _lead_end(st, _first_at(st, first)) if not lay.empty else st["start"],
        }
        return IdleParts(not lay.empty, first, *_split(c, st, _held(metrics), cols))

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


class _Steps(NamedTuple):
    """The steps `_split` measures: their ranks' codes (in `ranks`, sorted), which are held, their
    step, and their columns as floats (start, end, the idle windows' lo, hi and lead_hi)."""

    ranks: np.ndarray
    code: np.ndarray
    held: np.ndarray
    step: np.ndarray
    cols: dict[str, np.ndarray]


def _split(
    c: pd.DataFrame, st: pd.DataFrame, held: tuple[float, float] | None, bounds: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(seconds, pieces, spills) of `IdleParts` from the calls `c` of the steps `held` (`st`: the
    whole trace's steps; `bounds`, a column each: their idle windows, [lo, hi] after the step,
    [start, lead_hi] before its first forward, and their end). That time is communication, not
    an input pipeline (the premise). Ranks in chunks of bounded calls (`positions.rank_chunks`),
    vectorized over a chunk's ranks: a pass per rank and window cost ~2 ms (1,536 of them on 256
    ranks x 4 steps windowed: 2.9 s)."""
    if st.empty or c.empty:  # (`Idle.of` of no steps or calls: the steps without their windows)
        return _parts([])
    ranks = pd.Index(st["rank"].dropna().unique()).sort_values()  # st.groupby("rank")'s keys
    code = ranks.get_indexer(st["rank"])
    own = st["step"].between(*held).to_numpy() if held else np.zeros(len(st), dtype=bool)
    cols = {col: np.asarray(bounds[col], dtype=float) for col in ("start", "end", "lo", "hi", "lead_hi")}
    steps = _Steps(ranks.to_numpy(), code, own, st["step"].to_numpy(), cols)
    by_code = np.argsort(code, kind="stable")
    sorted_code = code[by_code]
    calls = ranks.get_indexer(c["rank"])
    ts, took = c["ts"].to_numpy(dtype=float), c["dur_s"].to_numpy(dtype=float)
    out = []
    for rows in positions.rank_chunks(calls):
        k, a = calls[rows], ts[rows]
        lo, hi = np.searchsorted(sorted_code, k[0], "left"), np.searchsorted(sorted_code, k[-1], "right")
        out.append(_split_chunk(steps, by_code[lo:hi], k, a, a + took[rows] * NS))
    return _parts(out)


def _split_chunk(
    s: _Steps, rows: np.ndarray, k: np.ndarray, a: np.ndarray, b: np.ndarray
) -> tuple[dict, ...]:
    """`_split`'s columns of a chunk's calls (rank codes `k`, by code; [a, b] in ns) on its ranks'
    steps (`rows` of `st`, by code, in order)."""
    start, k0 = s.cols["start"], int(k[0])
    span = int(k[-1]) - k0 + 1
    first, last = _group_ends(s.code[rows], rows, k0, span)
    mine = rows[s.held[rows]]
    mk = s.code[mine]
    f, h = _group_ends(mk, mine, k0, span)
    t0 = np.full(span, np.inf)  # each rank's window time: from its first step's start to the next one's
    t1 = np.full(span, np.inf)
    has = f >= 0
    t0[has] = np.where(f[has] != first[has], start[f[has]], -np.inf)
    t1[has] = np.where(h[has] != last[has], start[np.minimum(h[has] + 1, len(start) - 1)], np.inf)
    us, ue, uk = _unions(k, a, b)
    t0, t1 = t0[uk - k0], t1[uk - k0]
    before, after = us < t0, ue > t1
    spills = _by_code(
        {
            "rank": np.concatenate((uk[before], uk[after])),
            "lo": np.concatenate((us[before], np.maximum(us[after], t1[after]))),
            "hi": np.concatenate((np.minimum(ue[before], t0[before]), ue[after])),
        }
    )
    meet = _meeting(s, rows, spills)
    cs, ce = np.maximum(us, t0), np.minimum(ue, t1)
    keep = ce > cs
    cs, ce, ck = cs[keep], ce[keep], uk[keep]
    got, pieces = np.zeros((2, len(mine))), []
    new = np.ones(len(mine), dtype=bool)
    new[1:] = mk[1:] != mk[:-1]
    ends = (np.append(new[1:], True), new)  # the last step's gap, the first's lead-in: at the edges
    for which, (lo_col, hi_col) in enumerate((("lo", "hi"), ("start", "lead_hi"))):
        x, y = s.cols[lo_col][mine], s.cols[hi_col][mine]
        j0, j1 = _search(ck, ce, mk, x, "right"), _search(ck, cs, mk, y, "left")
        sel = np.flatnonzero((y > x) & (j1 > j0))
        n = (j1 - j0)[sel]
        row = np.repeat(sel, n)
        at = np.repeat(j0[sel] - (np.cumsum(n) - n), n) + np.arange(len(row))
        lo, hi = np.maximum(cs[at], x[row]), np.minimum(ce[at], y[row])
        edge = ends[which][row]
        on = row[edge]
        pieces.append(
            {
                "rank": mk[on],
                "step": s.step[mine[on]],
                "which": np.full(len(on), which),
                "lo": lo[edge],
                "hi": hi[edge],
            }
        )
        got[which] = _sums(row[~edge], hi[~edge] - lo[~edge], len(mine)) / NS
    hit = got.any(axis=0)
    parts = (
        {"rank": mk[hit], "step": s.step[mine[hit]], "gap": got[0, hit], "lead": got[1, hit]},
        _by_code({key: np.concatenate([p[key] for p in pieces]) for key in _PIECES}),
        {key: v[meet] for key, v in spills.items()},
    )
    for part in parts:
        part["rank"] = s.ranks[part["rank"]]
    return parts


def _group_ends(codes: np.ndarray, rows: np.ndarray, k0: int, span: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank code `k0`... (`span` of them): its first and last of `rows` (by code, in order),
    -1 where it has none."""
    first, last = np.full(span, -1, np.int64), np.full(span, -1, np.int64)
    if len(rows):
        new = np.flatnonzero(np.append(True, codes[1:] != codes[:-1]))
        first[codes[new] - k0] = rows[new]
        last[codes[new] - k0] = rows[np.append(new[1:], len(rows)) - 1]
    return first, last


def _unions(k: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each rank's intervals [a, b] merged (`_union`): starts, ends and rank codes, by code and time."""
    o = np.lexsort((a, k))
    k, a, b = k[o], a[o], b[o]
    new = np.flatnonzero(np.append(True, k[1:] != k[:-1]))
    if np.isnan(a).any() or np.isnan(b).any():  # `_union`'s loop, a rank at a time
        runs = [slice(i, j) for i, j in zip(new, np.append(new[1:], len(k)))]
        got = [_union(a[g], b[g]) for g in runs]
        codes = np.concatenate([np.full(len(u[0]), k[g.start]) for u, g in zip(got, runs)])
        return np.concatenate([u[0] for u in got]), np.concatenate([u[1] for u in got]), codes
    start = np.ones(len(k), dtype=bool)
    start[1:] = (k[1:] != k[:-1]) | (a[1:] > _cummax_by(k, b)[:-1])
    at = np.flatnonzero(start)
    return a[at], np.maximum.reduceat(b, at), k[at]


def _cummax_by(k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """`np.maximum.accumulate` of `v` within each run of equal codes `k` (NaN carried on)."""
    if not np.isnan(v).any():
        return pd.Series(v).groupby(k, sort=False).cummax().to_numpy()
    out = v.copy()
    new = np.flatnonzero(np.append(True, k[1:] != k[:-1]))
    for i, j in zip(new, np.append(new[1:], len(k))):
        out[i:j] = np.maximum.accumulate(v[i:j])
    return out


def _search(kc: np.ndarray, kv: np.ndarray, qc: np.ndarray, qv: np.ndarray, side: str) -> np.ndarray:
    """`np.searchsorted(kv, q, side)` of each query within its code's keys (`kc`, `kv`: sorted by
    code, then value), as an index into the keys: a binary search in each code's run of keys (one
    sort of the keys and queries together held ~34 bytes a step of the whole trace, every window)."""
    out = np.empty(len(qc), np.int64)
    if not len(qc):
        return out
    runs = np.r_[positions.starts_of(qc), len(qc)]  # (queries by code: a run each)
    for i, j in itertools.pairwise(runs):
        lo, hi = np.searchsorted(kc, qc[i], "left"), np.searchsorted(kc, qc[i], "right")
        out[i:j] = lo + np.searchsorted(kv[lo:hi], qv[i:j], side)
    return out


def _meeting(s: _Steps, rows: np.ndarray, spills: dict) -> np.ndarray:
    """Which `spills` meet the time of some step of their rank (`rows` of `st`: from its start to its
    end or its gap's end), where its idle windows lie: a window's calls before every step (its
    warm-up step's: no duration, no row) meet none."""
    if not len(spills["rank"]):  # (none to place: the rows' sort and search skipped)
        return np.zeros(0, dtype=bool)
    code, lo = s.code[rows], s.cols["start"][rows]
    o = np.lexsort((lo, code))  # the rows' time, as runs sorted by start
    code, lo = code[o], lo[o]
    hi = _cummax_by(code, np.maximum(s.cols["end"], s.cols["hi"])[rows][o])
    j = _search(code, lo, spills["rank"], spills["hi"], "left")  # rows starting before the spill ends
    return (j > np.searchsorted(code, spills["rank"], "left")) & (hi[np.maximum(j - 1, 0)] > spills["lo"])


def _sums(row: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """Per index 0..`n`-1, the sum of the `v` of its `row`s (in runs, in order) as `ndarray.sum`
    gives it: in order up to 7 values (beyond, numpy's pairwise sum: one `sum` a run)."""
    out = np.zeros(n)
    if not len(row):
        return out
    new = np.flatnonzero(np.append(True, row[1:] != row[:-1]))
    size = np.diff(np.append(new, len(row)))
    pos = np.arange(len(row)) - np.repeat(new, size)
    small = np.repeat(size <= 7, size)
    grid = np.zeros((len(new), 7))
    grid[np.repeat(np.arange(len(new)), size)[small], pos[small]] = v[small]
    total = grid[:, 0].copy()
    for p in range(1, 7):
        total += grid[:, p]
    out[row[new]] = total
    for i in np.flatnonzero(size > 7):
        out[row[new[i]]] = v[new[i] : new[i] + size[i]].sum()
    return out


def _by_code(part: dict) -> dict:
    """`part`'s columns in rank code order (stable: each rank's rows as they came)."""
    o = np.argsort(part["rank"], kind="stable")
    return {key: v[o] for key, v in part.items()}


def _parts(out: list[tuple[dict, ...]]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """`_split`'s chunks' columns as its frames."""
    frames = []
    for i, names in enumerate((["rank", "step", "gap", "lead"], _PIECES, ["rank", "lo", "hi"])):
        got = [o[i] for o in out if len(o[i]["rank"])]
        frames.append(
            pd.DataFrame({n: np.concatenate([g[n] for g in got]) for n in names})
            if got
            else pd.DataFrame(columns=names)
        )
    return frames[0], frames[1], frames[2]


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
