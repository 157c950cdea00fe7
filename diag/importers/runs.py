"""Which inputs belong to one run: `diag analyze runA runB` must never merge two jobs (it made "100%
idle between steps" of the gap between them and a bogus "rank 3 stopped emitting").

Each trace source gets a `RunSig` (job id, world size, ranks, time span, argv from diag headers;
distributedInfo and the events' span for Kineto). Sources of one run agree on the world size and
argv, hold different ranks (a diag trace and a Kineto trace of the same ranks are two captures), and
their time spans are within `GAP_NS` of each other. Logs carry no signature: they go with the run
when there is one.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diag.errors import DiagError

if TYPE_CHECKING:  # imported where frames are used: finding the inputs needs no pandas
    import pandas as pd

GAP_NS = 120 * 10**9  # two traces of one run overlap in time; back-to-back runs still differ in ranks
EPOCH_NS = 10**17  # times before 1973 are not wall-clock times
_LOCAL_RANK = re.compile(r"^--local[_-]rank(=.*)?$")


@dataclass
class RunSig:
    """What identifies the run a source (a diag trace directory or one Kineto file) came from."""

    path: str
    kind: str
    ranks: frozenset[int]
    world: int | None
    start_ns: int | None
    end_ns: int | None
    argv: tuple[str, ...] | None = None
    job_id: str | None = None

    def describe(self) -> str:
        bits = [
            self.job_id or "",
            f"world {self.world}" if self.world else "",
            _when(self.start_ns),
            f"ranks {','.join(map(str, sorted(self.ranks)))}" if self.ranks else "",
        ]
        return ", ".join(b for b in bits if b)


def _when(ns: int | None) -> str:
    if ns is None or ns < EPOCH_NS:
        return ""
    return "started " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


def _argv(argv: Any) -> tuple[str, ...] | None:
    """argv without the per-rank `--local_rank=N` the deepspeed launcher adds."""
    if not isinstance(argv, list) or not argv:
        return None
    out, skip = [], False
    for a in map(str, argv):
        if skip:
            skip = False
        elif _LOCAL_RANK.match(a):
            skip = "=" not in a
        else:
            out.append(a)
    return tuple(out)


def _span(frames: dict[str, pd.DataFrame]) -> tuple[int | None, int | None]:
    import pandas as pd

    lo, hi = [], []
    for df in frames.values():
        if "ts" in df.columns and len(df):
            if df["ts"].dtype == "int64":  # imported Kineto frames: no conversion to pay for
                lo.append(int(df["ts"].min()))
                hi.append(int(df["ts"].max()))
                continue
            ts = pd.to_numeric(df["ts"], errors="coerce").dropna()
            if len(ts):
                lo.append(int(ts.min()))
                hi.append(int(ts.max()))
    if not lo or min(lo) < EPOCH_NS:  # relative times (older Kineto, junk): not comparable
        return None, None
    return min(lo), max(hi)


def _world(headers: list[dict[str, Any]]) -> int | None:
    sizes = {h.get("world_size") for h in headers if isinstance(h.get("world_size"), int)}
    return sizes.pop() if len(sizes) == 1 else None


def of_frames(
    path: str, kind: str, headers: dict[int, dict[str, Any]], frames: dict[str, pd.DataFrame]
) -> RunSig:
    start, end = _span(frames)
    argvs = {_argv(h.get("argv")) for h in headers.values()} - {None}
    starts = [h["start_ts"] for h in headers.values() if isinstance(h.get("start_ts"), int)]
    if starts:
        start = min(starts + ([start] if start is not None else []))
    jobs = {h.get("job_id") for h in headers.values()} - {None}
    return RunSig(
        path,
        kind,
        frozenset(headers),
        _world(list(headers.values())),
        start,
        end,
        argvs.pop() if len(argvs) == 1 else None,
        jobs.pop() if len(jobs) == 1 else None,
    )


def same_run(a: RunSig, b: RunSig) -> bool:
    if a.job_id and b.job_id:  # the scheduler's word is final
        return a.job_id == b.job_id and not a.ranks & b.ranks
    if a.world and b.world and a.world != b.world:
        return False
    if a.argv is not None and b.argv is not None and a.argv != b.argv:
        return False
    if a.ranks & b.ranks:  # a second capture of a rank, a diag trace and a Kineto trace alike: they
        # number steps differently (ProfilerStep#N counts from the profiler's start: an HF Trainer
        # callback's #7 is the job's step 8) on different clocks, and merged each is counted twice
        return False
    if a.kind != b.kind:  # a diag trace and a Kineto trace of other ranks: their clocks may differ
        return True
    if None in (a.start_ns, a.end_ns, b.start_ns, b.end_ns):
        return True
    gap = max(a.start_ns, b.start_ns) - min(a.end_ns, b.end_ns)  # type: ignore[type-var,operator]
    return gap <= GAP_NS


def group(sigs: list[RunSig]) -> list[list[RunSig]]:
    """Sources grouped into runs, in input order: a source joins the first run it agrees with."""
    runs: list[list[RunSig]] = []
    for s in sigs:
        home = next((r for r in runs if all(same_run(s, o) for o in r)), None)
        if home is None:
            runs.append([s])
        else:
            home.append(s)
    return runs


class MixedRuns(DiagError):
    """Inputs from different runs: refused (exit 2) unless the command asked for one report each."""

    def __init__(self, runs: list[list[RunSig]], logs: list[str] | None = None) -> None:
        parts = [
            f"[{' '.join(s.path for s in r)}] ({r[0].describe() if len(r) == 1 else _merged(r)})"
            for r in runs
        ]
        super().__init__(
            f"inputs come from {_what(runs)}, not merged: "
            + "; ".join(parts)
            + " (analyze one at a time, or pass --each-run)"
        )
        # paths per run; logs (no identity of their own) are analyzed on their own under --each-run
        self.runs = [[s.path for s in r] for r in runs] + ([logs] if logs else [])


def _what(runs: list[list[RunSig]]) -> str:
    """What the runs are: the captures of one diag trace directory (attaches that wrote into it,
    each capture's rank files one run) said so, else different runs."""
    from diag.trace.reader import SUFFIXES, capture_of

    files = [s.path for r in runs for s in r]
    where = {os.path.dirname(os.path.abspath(f)) for f in files}
    each = [{capture_of(s.path)[0] for s in r} for r in runs]
    if (
        len(where) == 1
        and all(os.path.basename(f).startswith("rank-") and f.endswith(SUFFIXES) for f in files)
        and all(len(c) == 1 for c in each)
        and len(set().union(*each)) == len(runs)
    ):
        return f"{len(runs)} captures in {where.pop()} (attaches that wrote into one directory)"
    return f"{len(runs)} different runs (or capture windows)"


def _merged(run: list[RunSig]) -> str:
    return RunSig(
        "",
        run[0].kind,
        frozenset().union(*(s.ranks for s in run)),
        run[0].world,
        min((s.start_ns for s in run if s.start_ns is not None), default=None),
        None,
    ).describe()
