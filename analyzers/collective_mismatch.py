"""A desync from diag's own collective records (no Flight Recorder needed): in one process group, the
ranks' k-th collective of a step differs in op or size, i.e. one rank took a rank-dependent branch
around a collective. On NCCL and gloo the calls then never match: the group hangs in them (or, with
sizes that happen to fit, reduces garbage), and the timeout, if any, names neither rank nor call.

Collectives are aligned per (group, step, k-th of that step in that group, in issue order), so ranks
that attached at different moments still line up (each rank's first recorded step is left out: it
may be partial, even when numbered 0: an FSDP2 job attached within its first optimizer step read as
"rank 1: all_gather; rank 0: reduce_scatter" at step 0). In a live trace a record whose duration is
still unknown is held back by the agent for up to 10 s while later ones are written, so only
records that are final are compared: older than the rank's latest record by that hold, or up to a
call that never completed (a null duration: given up on, or announced by the agent as entered and
still waited in after 1.5 s, `liveness.entered`: a desync is named seconds after it, not 10 s).
Point-to-point ops are left out (their peers differ by rank), and all-to-all sizes (uneven splits
are normal), and calls whose process group the trace did not record (`vocab.UNNAMED_GROUP`: a
profiler trace of a torch that wrote no `Process Group Name`, or gloo's annotations): calls of
different communicators interleave freely, and HTA's public 128-rank sample of two ranks read as
"collective mismatch in group default: rank 0 all_to_all, rank 1 all_reduce" (CRITICAL).

The calls are read as reductions (`diag.metrics.reduction`: a window of steps at a time, merged):
each rank's first step (`FirstSteps`), then per group its first differing position (`Mismatches`),
then, for a position of equal camps, the calls made at its index in earlier steps (`Earlier`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd
from diag.analyzers import liveness
from diag.analyzers.base import rule

from diag.findings import Finding, Fix
from diag.metrics import positions, reduction
from diag.metrics.steps import NS
from diag.metrics.text import as_text
from diag.vocab import P2P, UNNAMED_GROUP

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

Cut = tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # rank -> [start, end) ns of its cut steps
Sig = tuple[str, int | None]  # a call's (op, size), `_sig`
HOLD_S = 10.0  # the agent's longest hold of a record whose duration is pending (agent.pending.MAX_HOLD_S)
ANY_SIZE = ("all_to_all",)  # ops whose per-rank sizes differ in a healthy job


def _final(trace: Trace, c: pd.DataFrame, keep: np.ndarray) -> np.ndarray:
    """Which of the `keep` records no held-back record can precede any more (all of them in a
    finished trace)."""
    if not liveness.live(trace):
        return keep
    last = liveness.last_record(trace)
    k = c.loc[keep, ["rank", "ts", "dur"]]
    stuck = k[pd.to_numeric(k["dur"], errors="coerce").isna()].groupby("rank")["ts"].max()
    bound = {r: max(float(last.get(r, 0)) - HOLD_S * NS, float(stuck.get(r, 0))) for r in k["rank"].unique()}
    out = keep.copy()
    out[keep] = (k["ts"].astype(float) <= k["rank"].map(bound)).to_numpy()
    return out


class _Calls(NamedTuple):
    """The compared calls as a compact key, one entry per call (rows of the frame `c` read):
    group code (into `names`, sorted), rank code, step, `k` (its index among its rank's calls in
    its group and step, in issue order) and an (op, size) code `sig` (-1: no op)."""

    c: pd.DataFrame
    rows: np.ndarray
    group: np.ndarray
    names: pd.Index
    rank: np.ndarray
    step: np.ndarray
    k: np.ndarray
    sig: np.ndarray
    ranks: np.ndarray  # the rank of each rank code

    def near(self, group: str, step: int, k: int) -> pd.DataFrame:
        """The calls of `group` at index `k` up to `step` (its earlier steps: `_culprits`), as a
        frame of the columns the finding reads."""
        at = (self.group == self.names.get_loc(group)) & (self.k == k) & (self.step <= step)
        c = self.c.iloc[self.rows[at]]
        return pd.DataFrame(
            {
                "rank": c["rank"].to_numpy(),
                "group": as_text(c["group"]).to_numpy(),
                "step": self.step[at],
                "ts": c["ts"].to_numpy(),
                "kind": c["kind"].to_numpy(),
                "bytes": c["bytes"].to_numpy(),
                "k": self.k[at],
            }
        )


def _compared(
    trace: Trace,
    metrics: Metrics,
    c: pd.DataFrame,
    first: dict[int, int] | None = None,
    cut: Cut | None = None,
) -> _Calls:
    """The calls compared: final ones (`_final`), not p2p, with a step and a time, after each
    rank's first recorded step (a trace may begin mid-step: attach, whatever its number; `first`:
    the whole trace's, else of `c`), in a group; each as its compact key, no copy of the frame's
    rows (a copy of 7 columns and the sort of their keys were this rule's peak: +509 MiB for a
    64-rank x 1,000-step trace). `cut`: the steps sessions began inside (`_session_starts`)."""
    p2p = c["kind"].isin(P2P).to_numpy()
    cut = _session_starts(trace) if cut is None else cut
    # each call's k as this rule's stage placed it, if it did (`Metrics.placed`: placing them all
    # here would be a larger peak than counting k one rank at a time), where leaving calls out
    # moves no other call of its rank, group and step: only a whole one (a group, a step), or the
    # last ones in time (the not yet final; no start: sorted last)
    held = metrics.placed
    placed = held.k if held is not None and c is metrics.comms and not cut and _apart(c, p2p) else None
    return _keyed(c, _kept(trace, c, p2p), cut, placed, first)


def _kept(trace: Trace, c: pd.DataFrame, p2p: np.ndarray) -> np.ndarray:
    """Which calls may be compared, each rank's first step not yet left out."""
    keep = ~p2p & c["step"].notna().to_numpy() & c["ts"].notna().to_numpy()
    keep &= (as_text(c["group"]) != UNNAMED_GROUP).to_numpy()  # which communicator: not recorded
    return _final(trace, c, keep)


def _apart(c: pd.DataFrame, p2p: np.ndarray) -> bool:
    """No group holds both point-to-point calls and others (each is left out or kept whole)."""
    if not p2p.any():
        return True
    group = positions.coded(as_text(c["group"]))[0]
    return not np.intersect1d(group[p2p], group[~p2p]).size


def _session_starts(trace: Trace) -> Cut:
    """Per rank: the [start, next start) spans of its steps that an agent's session began inside
    (a first boundary's record has no duration; its start is the agent's install). Each rank's
    agent starts at its own point of that step, so its k-th calls there do not pair up: a
    re-attach to a healthy Megatron-DeepSpeed job read "collective mismatch in group tp:6 at step
    127" (CRITICAL) at the first step of the second attach, in 2 runs of 2. Calls are placed by
    time, not by their step number: that step's calls can carry the number before the one its
    boundary's record has (306 where the record said 307). Of the whole trace's step records
    (a window's calls can lie in a step whose record another window holds)."""
    st = trace.steps
    if st.empty or not {"ts", "dur"} <= set(st.columns) or not st["dur"].isna().any():
        return ()
    out = []
    for rank, mine in st[["rank", "ts", "dur"]].groupby("rank", sort=True):
        mine = mine.sort_values("ts", kind="stable")
        starts, began = pd.to_numeric(mine["ts"]).to_numpy(np.int64), mine["dur"].isna().to_numpy()
        ends = np.append(starts[1:], np.iinfo(np.int64).max)
        spans = tuple((int(a), int(b)) for a, b in zip(starts[began], ends[began], strict=True))
        if spans:
            out.append((int(rank), spans))
    return tuple(out)


def _in_cut_steps(c: pd.DataFrame, rows: np.ndarray, cut: Cut) -> np.ndarray:
    """Which of `rows` fall in a step an agent's session began inside (`_session_starts`)."""
    out = np.zeros(len(rows), dtype=bool)
    if not cut:
        return out
    ranks = c["rank"].to_numpy()[rows]
    ts = positions.numbers(c["ts"])[rows]
    for rank, spans in cut:
        mine = np.flatnonzero(ranks == rank)
        lo, hi = (np.array(v, dtype=np.int64) for v in zip(*spans, strict=True))
        at = np.searchsorted(lo, ts[mine], side="right") - 1
        out[mine] = (at >= 0) & (ts[mine] < hi[np.maximum(at, 0)])
    return out


def _keyed(
    c: pd.DataFrame,
    keep: np.ndarray,
    cut: Cut,
    placed: np.ndarray | None = None,
    firsts: dict[int, int] | None = None,
) -> _Calls:
    """The `keep` rows of `c` after each rank's first step (`firsts`, else the least of its
    rows') and outside the steps its sessions began inside (`cut`), in a group, each as its key:
    int32 arrays but the step (a 64-rank x 1,000-step trace's 3.4 M calls: 95 MiB). `placed`:
    each row's k, where the rows left out change none (`_compared`), else counted here."""
    rows = np.flatnonzero(keep).astype(np.int32 if len(c) < 2**31 else np.int64)
    step = pd.to_numeric(c["step"]).to_numpy()[rows].astype(np.int64)
    codes, ranks = pd.factorize(c["rank"].to_numpy()[rows])
    rank = codes.astype(np.int32)
    if firsts is None:
        first = np.full(int(rank.max()) + 1 if len(rank) else 0, np.iinfo(np.int64).max)
        np.minimum.at(first, rank[rank >= 0], step[rank >= 0])
    else:
        first = np.array([firsts.get(int(r), np.iinfo(np.int64).max) for r in ranks], dtype=np.int64)
    group, names = positions.coded(as_text(c["group"]), rows)  # missing: -1
    later = (rank >= 0) & (group >= 0) & (step > first[np.maximum(rank, 0)]) & ~_in_cut_steps(c, rows, cut)
    rows, step, rank, group = rows[later], step[later], rank[later], group[later]
    del later, first
    if placed is not None:
        k = placed[rows]
    else:
        k = positions.index_per_rank(rank, positions.numbers(c["ts"])[rows], (group, step))
    return _Calls(c, rows, group, names, rank, step, k, _signatures(c, rows), np.asarray(ranks))


def _signatures(c: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """One integer per distinct (op, size) of each call of `rows`, -1 for a call of no op (not
    counted among the signatures, as a groupby's NaN key is not): strings of them took 200 MB for
    3.4 M calls. The size of an op in `ANY_SIZE` counts as unknown."""
    # the rows' values alone (`.array`: no copy of the frame's index) and arithmetic in place: the
    # temporaries of 3.4 M calls are 27 MiB an int64 array
    kind = pd.Series(c["kind"].array[rows])
    nbytes = pd.Series(c["bytes"].array[rows])
    nbytes = pd.to_numeric(nbytes, errors="coerce").to_numpy(float, copy=True, na_value=np.nan)
    nbytes[kind.isin(ANY_SIZE).to_numpy()] = np.nan
    np.round(nbytes, out=nbytes)
    nbytes[np.isnan(nbytes)] = -1  # None
    size = pd.factorize(nbytes.astype(np.int64))[0]
    del nbytes
    codes = positions.coded(kind)[0]
    sig = codes.astype(np.int64)
    sig *= int(size.max(initial=0)) + 1
    sig += size
    sig[codes < 0] = -1
    return sig.astype(np.int32) if sig.max(initial=0) < 2**31 else sig


def _sig(row: Any) -> tuple[str, int | None]:
    nbytes = row["bytes"]
    size = None if row["kind"] in ANY_SIZE or nbytes != nbytes or nbytes is None else int(nbytes)
    return (str(row["kind"]), size)


def _majority(at: pd.DataFrame) -> Sig | None:
    """The call a strict majority of the position's ranks made (None: equal camps)."""
    camps: dict[Sig, int] = {}
    for sig in (_sig(row) for _, row in at.iterrows()):
        camps[sig] = camps.get(sig, 0) + 1
    big = max(camps.values())
    return next(s for s, n in camps.items() if n == big) if list(camps.values()).count(big) == 1 else None


def _culprits(at: pd.DataFrame, seen: set[Sig]) -> tuple[list[int], Sig]:
    """The ranks whose call differs and the call the others made: a strict majority's; between equal
    camps, the call the group made at this position in earlier steps (`seen`: the ranks that left
    it)."""
    sigs = {int(r): _sig(row) for r, row in at.set_index("rank").iterrows()}
    usual = _majority(at)
    if usual is None:
        known = [s for s in dict.fromkeys(sigs.values()) if s in seen]
        if len(known) != 1:
            return sorted(sigs), ("", None)  # no way to tell which side left the usual call
        usual = known[0]
    return sorted(r for r, s in sigs.items() if s != usual), usual


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n} B"


@rule("collective_mismatch")
def collective_mismatch(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires (critical) when, in one process group, every member recorded its k-th collective of a step
    and they differ in op or byte size (diag's own records, final ones only in a live trace; not p2p,
    not all-to-all sizes, not calls of a group the trace did not record). Names the ranks outside a
    strict majority, or, between equal camps, the ranks that left the call the group made at that
    position in earlier steps (all members when that cannot be told), with the group, step and each
    rank's call. Fix: the named ranks' code path around that call (a rank-dependent branch, a
    data-dependent shape). Live, a record is compared once final: 10 s older than its rank's latest
    record (the agent's hold), or up to a call never completed (given up on, or still waited in after
    1.5 s)."""
    firsts = metrics.reduce(FirstSteps())
    if len(firsts) < 2:
        return []  # (one rank's calls: no two members to differ)
    cut = _session_starts(trace)
    found = metrics.reduce(Mismatches(firsts, cut)).mismatches()
    tied = frozenset((f.group, f.step, f.k) for f in found if _majority(f.at) is None)
    seen = metrics.reduce(Earlier(firsts, cut, tied)) if tied else {}
    return [_finding(f.group, f.step, f.k, f.at, seen.get(f.group, set())) for f in found]


def _entered(metrics: Metrics) -> pd.DataFrame | None:
    """The calls this rule reads (`liveness.entered`), None where they name no group or step."""
    c = liveness.entered(metrics.trace, metrics)
    return None if c.empty or "group" not in c or "step" not in c else c


@dataclass(frozen=True)
class FirstSteps:
    """Each rank's first step of the calls compared (`_kept`), left out: (rank, step) pairs, the
    least over the windows."""

    def of(self, metrics: Metrics) -> frozenset[tuple[int, int]]:
        c = _entered(metrics)
        if c is None:
            return frozenset()
        keep = _kept(metrics.trace, c, c["kind"].isin(P2P).to_numpy())
        step = pd.Series(pd.to_numeric(c["step"]).to_numpy()[keep].astype(np.int64))
        least = step.groupby(c["rank"].to_numpy()[keep]).min()
        return frozenset((int(r), int(s)) for r, s in least.items())

    def merged(self, parts: list[frozenset[tuple[int, int]]]) -> frozenset[tuple[int, int]]:
        out: dict[int, int] = {}
        for part in parts:
            for r, s in part:
                out[r] = min(s, out.get(r, s))
        return frozenset(out.items())

    folds = True  # (its merged value is a part: each rank's least step)


class Mismatch(NamedTuple):
    """A group's first differing position and its calls (`at`, in issue order)."""

    group: str
    step: int
    k: int
    at: pd.DataFrame


@dataclass
class _Part:
    """A window's, or consecutive windows': per group the ranks of its compared calls and its first
    differing position among those ranks (of the first window that holds all of them)."""

    members: dict[str, np.ndarray]
    found: dict[str, Mismatch]

    def mismatches(self) -> list[Mismatch]:
        """The first differing positions, by group."""
        return [self.found[g] for g in sorted(self.found)]


@dataclass(frozen=True)
class Mismatches:
    """Per group (by name), its first differing position (`_first_differing`) of the whole trace.
    A window's first is the whole trace's where that window holds calls of each of the group's
    members (a position counts once every member made its call: a window short of one has none)
    and no earlier window's does."""

    firsts: frozenset[tuple[int, int]]
    cut: Cut

    def of(self, metrics: Metrics) -> _Part:
        c = _entered(metrics)
        if c is None:
            return _Part({}, {})
        calls = _compared(metrics.trace, metrics, c, dict(self.firsts), self.cut)
        found = {}
        for group, step, k in _first_differing(calls):
            near = calls.near(group, step, k)
            at = near[near["step"] == step].sort_values("ts", kind="stable")  # in issue order
            found[group] = Mismatch(group, step, k, at)
        return _Part(_member_ranks(calls), found)

    def merged(self, parts: list[_Part]) -> _Part:
        members: dict[str, np.ndarray] = {}
        for p in parts:
            for g, ranks in p.members.items():
                members[g] = np.union1d(members[g], ranks) if g in members else ranks
        found = {}
        for g in sorted(members):  # (a window's ranks of a group are among the whole's: as many, the same)
            whole = len(members[g])
            f = next((p.found[g] for p in parts if g in p.found and len(p.members[g]) == whole), None)
            if f is not None:
                found[g] = f
        return _Part(members, found)

    folds = True  # (its merged value is a part: a position found short of its group's members dropped)


@dataclass(frozen=True)
class Earlier:
    """Per group of `at` ((group, step, k): a position of equal camps), the (op, size)s its compared
    calls at index k made in earlier steps (`_culprits`): asked only for such a finding."""

    firsts: frozenset[tuple[int, int]]
    cut: Cut
    at: frozenset[tuple[str, int, int]]

    def of(self, metrics: Metrics) -> dict[str, set[Sig]]:
        c = _entered(metrics)
        if c is None:
            return {}
        calls = _compared(metrics.trace, metrics, c, dict(self.firsts), self.cut)
        out = {}
        for group, step, k in self.at:
            if group in calls.names:
                near = calls.near(group, step - 1, k)
                out[group] = {_sig(row) for _, row in near.iterrows()}
        return out

    def merged(self, parts: list[dict[str, set[Sig]]]) -> dict[str, set[Sig]]:
        out: dict[str, set[Sig]] = {}
        for p in parts:
            for g, sigs in p.items():
                out[g] = out.get(g, set()) | sigs
        return out

    folds = True  # (its merged value is a part: sets)


def _member_ranks(calls: _Calls) -> dict[str, np.ndarray]:
    """Per group name, the ranks of its compared calls, sorted (`positions.members`' ranks): an
    array, 8 bytes a member, as every window's part holds them until merged."""
    if not len(calls.group):
        return {}
    width = int(calls.rank.max()) + 1
    pairs = calls.group.astype(np.int64) * width + calls.rank
    cells = (len(calls.names) + 1) * width
    if cells <= len(pairs) + 2**20:  # a table of the (group, rank) cells: no sort of the calls
        seen = np.zeros(cells, dtype=bool)
        seen[pairs] = True
        pairs = np.flatnonzero(seen)
    else:
        pairs = np.unique(pairs)
    groups, starts = np.unique(pairs // width, return_index=True)
    return {
        str(calls.names[g]): np.unique(calls.ranks[rows].astype(np.int64))
        for g, rows in zip(groups, np.split(pairs % width, starts[1:]), strict=True)
    }


def _first_differing(calls: _Calls) -> list[tuple[str, int, int]]:
    """Per group, the first (step, k) that every member recorded and whose calls differ (`_sig`),
    found with whole-array operations: a live job of fast steps has hundreds of thousands of
    positions, and one Python step per position took 5.7 s a look in `diag watch`. Each position
    (group, step, k) is one integer; per position, the calls and the least and greatest signature
    are reductions into an array of the positions (`ufunc.at`), no sort of the calls."""
    if not len(calls.group):
        return []
    group, step, k, sig = calls.group, calls.step, calls.k, calls.sig
    members = positions.members(group, calls.rank)
    lo, hi = int(step.min()), int(step.max())
    if hi - lo < len(step) + 2**20:  # every step of the range: the step's offset is its code
        width, step_code = hi - lo + 1, None
    else:
        steps, step_code = np.unique(step, return_inverse=True)
        width = len(steps)
    depth = int(k.max()) + 1
    if len(calls.names) * width * depth < 2**62:
        key = group.astype(np.int64)  # (group * width + step code) * depth + k, in place
        key *= width
        if step_code is None:
            key += step
            key -= lo
        else:
            key += step_code
        key *= depth
        key += k
    else:  # (astronomical step and call counts: the distinct triples, numbered in their order)
        code = step - lo if step_code is None else step_code
        key = np.unique(np.stack([group, code, k], axis=1), axis=0, return_inverse=True)[1]
    del step_code
    key = key.reshape(-1)
    if int(key.max()) < len(key) + 2**20:  # one entry per possible position
        ids, count = key, int(key.max()) + 1
    else:  # (sparse positions: those taken, numbered in order)
        taken, ids = np.unique(key, return_inverse=True)
        ids, count = ids.reshape(-1), len(taken)
    del key
    calls_at = np.bincount(ids, minlength=count)  # a rank has one call at a position: calls = ranks
    none = np.iinfo(sig.dtype).max
    least = np.full(count, none, sig.dtype)
    np.minimum.at(least, ids, np.where(sig < 0, none, sig))
    most = np.full(count, -1, sig.dtype)
    np.maximum.at(most, ids, sig)
    g = np.zeros(count, np.int64)
    g[ids] = group
    odd = (calls_at == members[g]) & (most >= 0) & (least < most) & (calls_at >= 2)
    out = []
    seen: set[int] = set()
    first_row = np.full(count, -1, np.int64)
    pick = np.flatnonzero(odd[ids])
    first_row[ids[pick[::-1]]] = pick[::-1]  # a call at each odd position: its step and k
    for i in np.flatnonzero(odd):  # sorted by group, step, k: each group's first is its first here
        if g[i] not in seen:
            seen.add(int(g[i]))
            row = first_row[i]
            out.append((str(calls.names[g[i]]), int(step[row]), int(k[row])))
    return out


def _finding(group: str, step: int, k: int, at: pd.DataFrame, seen: set[Sig]) -> Finding:
    ranks, usual = _culprits(at, seen)
    calls = {
        int(r): {"op": op, "bytes": n}
        for r, (op, n) in ((r, _sig(row)) for r, row in at.set_index("rank").iterrows())
    }
    odd = calls[ranks[0]]
    others = sorted(set(calls) - set(ranks))
    said = (
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} called {odd['op']} "
        f"({_size(odd['bytes'])}) where rank{'s' if len(others) > 1 else ''} "
        f"{', '.join(map(str, others))} called {usual[0]} ({_size(usual[1])})"
        if others
        else "ranks called "
        + "; ".join(f"rank {r}: {v['op']} ({_size(v['bytes'])})" for r, v in calls.items())
    )
    return Finding(
        severity="critical",
        title=f"collective mismatch in group {group} at step {step}: {said}",
        detail=(
            f"call #{k + 1} of step {step} in group {group} differs between ranks: the calls cannot "
            "match, so the group hangs in them (or reduces mismatched buffers)"
        ),
        evidence={
            "group": group,
            "step": step,
            "index_in_step": k,
            "collective": odd["op"],
            "calls": calls,
            "expected": {"op": usual[0], "bytes": usual[1]} if others else None,
        },
        ranks=ranks,
        steps=[step],
        fixes=[
            Fix(
                f"look at rank {ranks[0]}'s code path at step {step} (`diag stacks`, py-spy dump): a "
                "rank-dependent branch around a collective, or a data-dependent tensor shape",
                env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
            )
        ],
    )


# what the rule asks first: computed in the windowed pass's first pass (`reduction.early`)
reduction.early(lambda _trace: FirstSteps())
