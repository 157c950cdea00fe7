"""Each rank's last records and calls, reduced to what the hang and crash rules read of them.

Why a reduction and not the calls: the windowed pass (docs/scale.md, last section) reads a job a
window of steps at a time and cannot hold every call. `hang_desync`, `job_crash` and `liveness`
read only "last / count / max" figures: per rank its latest record of each kind; per (group, rank)
its calls, completed calls and last call; per rank its last call, its never-completed calls (a
null duration: the agent gave up waiting, after 10 s, or closed) and its entered-not-completed ones
(`comm_open` rows without their `comm` record: both carry the call's step, so they meet in one
window); the latest call end. Each merges exactly across windows taken in step order (`merged`):
maxima, sums, and lasts replaced by a later part only on a strictly greater time where the whole
frame keeps its first of equal ones (`idxmax`), or on an equal one where it keeps its last (a
stable sort's last row). The ties are the whole
frame's only where it holds each rank's rows in time order, ranks ascending (a trace's frames,
`comm_frame`'s): the merged rows of several ranks are put in rank order, then window order.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from diag import schema
from diag.metrics import tails
from diag.metrics.text import as_text

ROW = ["rank", "group", "kind", "ts", "dur", "step", "bytes"]  # a call's columns the rules print
KINDS = (schema.STEP, schema.COMM, schema.STATS, schema.ERROR, schema.MEMORY, schema.LAYER)
# the record kinds whose per-rank latest time says where a rank's process stopped (`liveness`)


# the frames `latest` last read (weakly: a live view must not keep a replaced trace's frames) and
# its answer: `liveness.last_record` is asked 5 times a run, `Metrics.lasts` once
_LATEST: list[Any] = [(), {}]


def latest(frames: Mapping[str, pd.DataFrame]) -> dict[str, pd.Series]:
    """Per record kind of `KINDS` recorded: each rank's greatest `ts` (ns; missing ones skipped).
    Read-only (shared by its callers). The windowed pass's frames carry their windows' (`latest`:
    they hold no call or layer record)."""
    merged = getattr(frames, "latest", None)
    if merged is not None:
        return dict(merged)
    held = [frames.get(kind) for kind in KINDS]
    seen = _LATEST[0]
    if len(seen) == len(held) and all((r() if r else None) is f for r, f in zip(seen, held)):
        return dict(_LATEST[1])
    out = latest_of(frames)
    _LATEST[:] = [tuple(weakref.ref(f) if f is not None else None for f in held), out]
    return dict(out)


def latest_of(frames: Mapping[str, pd.DataFrame]) -> dict[str, pd.Series]:
    """`latest`, computed (not cached): one window's."""
    out = {}
    for kind in KINDS:
        df = frames.get(kind)
        if df is not None and not df.empty and "ts" in df:
            out[kind] = tails.max_by_rank(pd.to_numeric(df["ts"], errors="coerce"), df["rank"])
    return out


def seen(latest: Mapping[str, pd.Series], kinds: tuple[str, ...] = KINDS) -> pd.Series:
    """Each rank's latest record (ns) of `kinds` (of `latest`'s): the greatest over them."""
    held = [latest[k] for k in kinds if k in latest]
    if not held:
        return pd.Series(dtype="float64")
    return pd.concat(held, axis=1).max(axis=1)


def merge_latest(parts: list[dict[str, pd.Series]]) -> dict[str, pd.Series]:
    out = {}
    for kind in KINDS:
        held = [p[kind] for p in parts if kind in p]
        if held:
            out[kind] = held[0] if len(held) == 1 else pd.concat(held).groupby(level=0).max()
    return out


def _rows(c: pd.DataFrame, at: np.ndarray | pd.Series) -> pd.DataFrame:
    """The `ROW` columns of `c`'s rows `at` (positions or a mask), group as text."""
    part = c.iloc[at] if isinstance(at, np.ndarray) else c[at]
    part = part[[col for col in ROW if col in part]]
    return part.assign(group=part["group"].astype(object)).reset_index(drop=True)


def unmatched(c: pd.DataFrame, opened: pd.DataFrame) -> pd.DataFrame:
    """The `comm_open` rows (`opened`) whose call's `comm` record (same rank and issue time) is not
    among `c`'s: entered, not completed yet."""
    if c.empty:
        return opened
    have = set(zip(c["rank"].astype(int), pd.to_numeric(c["ts"]).astype("int64")))
    keys = zip(opened["rank"].astype(int), pd.to_numeric(opened["ts"]).astype("int64"))
    return opened[[k not in have for k in keys]]


@dataclass(frozen=True)
class Tails:
    """The calls' (`comm_frame` rows) and records' lasts. Empty-safe: `of` an empty frame."""

    calls: int
    latest: dict[str, pd.Series]  # record kind -> rank -> greatest ts (ns)
    groups: pd.DataFrame  # (group, rank) in order -> count, done, and its last call's ts, kind, bytes, step
    last: pd.DataFrame  # per rank (in order) its last call (greatest ts, the later row of equal ones)
    pending: pd.DataFrame  # the calls never completed (null dur), in the frame's order (rank, time)
    opened: pd.DataFrame  # `comm_open` rows without their `comm` record (entered, not completed)
    latest_end: float  # the greatest ts + dur (NaN where none is known)

    @classmethod
    def of(
        cls,
        c: pd.DataFrame,
        opened: pd.DataFrame | None = None,
        frames: Mapping[str, pd.DataFrame] | None = None,
    ) -> Tails:
        """Reduce `c` (`comm_frame` rows), the `comm_open` rows read as calls (`opened`, a null
        duration each) and the records' `frames` of one window (the whole trace)."""
        rec = latest(frames or {})
        if c.empty:
            groups = pd.DataFrame(columns=["group", "rank", "count", "done", "ts", "kind", "bytes", "step"])
            empty = pd.DataFrame(columns=ROW)
            o = opened if opened is not None and not opened.empty else empty
            return cls(0, rec, groups, empty, empty, _rows(o, np.arange(len(o))) if len(o) else empty, np.nan)
        pend = pd.to_numeric(c["dur"], errors="coerce").isna()
        pending = _rows(c, pend.to_numpy())
        text = as_text(c["group"])
        lasts = tails.last_per_group(text, c["rank"], c["ts"])
        groups = pd.DataFrame({"group": lasts.group.astype(object), "rank": lasts.rank, "count": lasts.count})
        for col in ("ts", "kind", "bytes", "step"):
            groups[col] = c[col].iloc[lasts.row].to_numpy()
        held = (
            pd.Series(1, index=pending.index)
            .groupby([text[pend].to_numpy(), pending["rank"].to_numpy()])
            .sum()
        )
        key = pd.MultiIndex.from_arrays([groups["group"], groups["rank"]])
        groups["done"] = groups["count"] - held.reindex(key, fill_value=0).to_numpy()
        at = tails.last_rows(c["rank"], c["ts"])
        if opened is not None and not opened.empty:
            opened = unmatched(c, opened)
        o = _rows(opened, np.arange(len(opened))) if opened is not None and len(opened) else pending.iloc[:0]
        return cls(
            calls=len(c),
            latest=rec,
            groups=groups[["group", "rank", "count", "done", "ts", "kind", "bytes", "step"]],
            last=_rows(c, at),
            pending=pending,
            opened=o,
            latest_end=tails.latest_end(c["ts"], c["dur"]),
        )

    @classmethod
    def merged(cls, parts: list[Tails]) -> Tails:
        """Parts of windows of one trace, in step order (each window's ranks' parts as one), as one."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.of(pd.DataFrame(columns=ROW))
        order = [np.full(len(p.groups), i) for i, p in enumerate(parts)]
        g = pd.concat([p.groups for p in parts if len(p.groups)] or [parts[0].groups], ignore_index=True)
        g["_part"] = np.concatenate(order) if len(g) else np.zeros(0, np.int64)
        # per (group, rank) the greatest ts, the earlier part on ties (the whole frame's `idxmax`)
        g = g.sort_values(
            ["group", "rank", "ts", "_part"], ascending=[True, True, False, True], kind="stable"
        )
        by = g.groupby(["group", "rank"], sort=False)
        first = g[~g.duplicated(["group", "rank"])].reset_index(drop=True)
        first["count"] = by["count"].sum().to_numpy()
        first["done"] = by["done"].sum().to_numpy()
        calls = [p.last.assign(_part=i) for i, p in enumerate(parts) if len(p.last)]
        last = pd.concat(calls, ignore_index=True) if calls else parts[0].last.assign(_part=0)
        # per rank the greatest ts, the later part on ties (the whole frame's stable sort's last)
        last = last.sort_values(["rank", "ts", "_part"], kind="stable").groupby("rank").tail(1)
        return cls(
            calls=sum(p.calls for p in parts),
            latest=merge_latest([p.latest for p in parts]),
            groups=first.drop(columns="_part").astype({"count": "int64", "done": "int64"}),
            last=last.drop(columns="_part").reset_index(drop=True),
            pending=_in_rank_order([p.pending for p in parts]),
            opened=_in_rank_order([p.opened for p in parts]),
            latest_end=float(np.fmax.reduce([p.latest_end for p in parts])),
        )

    def merge(self, other: Tails) -> Tails:
        """This window's and a later one's together."""
        return Tails.merged([self, other])

    def seen(self, kinds: tuple[str, ...] = KINDS) -> pd.Series:
        """Each rank's latest record (ns) of `kinds`: the greatest over them."""
        return seen(self.latest, kinds)

    def entered(self, ranks: list[int]) -> pd.DataFrame:
        """`ranks`' calls never completed, then those entered and not completed (`liveness.entered`'s
        pending rows, in its order)."""
        parts = [f[f["rank"].isin(ranks)] for f in (self.pending, self.opened) if len(f)]
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0] if parts else self.pending


def _in_rank_order(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Rows of windows in step order, in the whole frame's order: each rank's, in time order."""
    held = [p for p in parts if len(p)]
    if len(held) < 2:
        return held[0] if held else parts[0]
    return pd.concat(held, ignore_index=True).sort_values("rank", kind="stable").reset_index(drop=True)
