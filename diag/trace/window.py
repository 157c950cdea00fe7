"""`diag analyze --ranks 0-3,8 --steps 100:120`: analyze a window of a long or wide job.

A rank outside the window is not read at all when its file says its rank up front (a diag
`rank-00003.jsonl`, a Kineto file whose `distributedInfo` comes before its events, as torch writes
it); otherwise it is read and dropped. Steps outside the window are dropped
as each rank is read (in the worker, for Kineto), so memory follows the window, not the job. Events
outside every step (step -1) go with them; records that carry no step at all (headers, meta,
NVML samples) are kept.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diag.errors import DiagError
from diag.trace import safeio

if TYPE_CHECKING:
    import pandas as pd

HEAD_BYTES = 64 << 10  # where torch's export puts distributedInfo: before the (long) event list
_DIAG_RANK = re.compile(r"^rank-0*(\d+)\.jsonl(?:\.gz)?$")  # (plain or gzipped: reader.SUFFIXES)
_INFO_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')


@dataclass(frozen=True)
class Window:
    """Which ranks (None: all) and which steps, `lo <= step < hi` (None: open)."""

    ranks: frozenset[int] | None = None
    lo: int | None = None
    hi: int | None = None

    @property
    def steps(self) -> bool:
        return self.lo is not None or self.hi is not None

    def __bool__(self) -> bool:
        return self.ranks is not None or self.steps

    def wants_rank(self, rank: Any) -> bool:
        return self.ranks is None or rank in self.ranks

    def wants_step(self, step: Any) -> bool:
        """A record with no step (or not an integer one) is kept; one outside the window is not."""
        if not self.steps or not isinstance(step, int) or isinstance(step, bool):
            return True
        return (self.lo is None or step >= self.lo) and (self.hi is None or step < self.hi)

    def frames(self, frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        """Each frame's rows of the selected ranks and steps (a frame with no such column: whole)."""
        out = {}
        for kind, df in frames.items():
            keep = None
            if self.ranks is not None and "rank" in df.columns:
                keep = df["rank"].isin(list(self.ranks))
            if self.steps and "step" in df.columns:
                import pandas as pd

                step = pd.to_numeric(df["step"], errors="coerce")
                inside = step.notna()
                if self.lo is not None:
                    inside &= step >= self.lo
                if self.hi is not None:
                    inside &= step < self.hi
                keep = inside if keep is None else keep & inside
            out[kind] = df if keep is None or bool(keep.all()) else df[keep.to_numpy()].reset_index(drop=True)
        return out


ALL = Window()  # no window: every rank and step


def parse(ranks: str | None, steps: str | None) -> Window:
    """`--ranks 0-3,8` and `--steps A:B` (as a Python slice: A included, B not; either may be
    omitted); a bad one is a one-line `DiagError`."""
    chosen: set[int] | None = None
    if ranks is not None:
        chosen = set()
        for part in filter(None, (p.strip() for p in ranks.split(","))):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
                raise DiagError(f"--ranks: {part!r} is not a rank or a range like 0-7")
            chosen.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
        if not chosen:
            raise DiagError("--ranks: no rank given")
    lo = hi = None
    if steps is not None:
        m = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*", steps)
        if not m:
            raise DiagError(f"--steps: {steps!r} is not A:B (step A up to, not including, B)")
        lo, hi = (int(g) if g else None for g in m.groups())
        if lo is not None and hi is not None and hi <= lo:
            raise DiagError(f"--steps: {steps!r} selects no step (B must be greater than A)")
    return Window(frozenset(chosen) if chosen is not None else None, lo, hi)


def kineto_rank(path: str) -> int | None:
    """The rank a Kineto file's head says (distributedInfo before the events); None when it does
    not (the file must be read to know: its name is only a fallback, and a later distributedInfo
    wins over it)."""
    try:
        with safeio.open_regular(path) as f:
            head = f.read(HEAD_BYTES)
            if head[:2] == safeio.GZIP_MAGIC:
                import gzip

                f.seek(0)
                with gzip.open(f) as g:
                    head = g.read(HEAD_BYTES)
    except (OSError, EOFError, safeio.InputError, ValueError):
        return None  # the import says what is wrong with it
    events = head.find(b'"traceEvents"')
    m = _INFO_RANK.search(head if events < 0 else head[:events])
    return int(m.group(1)) if m else None


def diag_file_rank(path: str) -> int | None:
    """The rank in a diag trace file's name (rank-00003.jsonl, or .jsonl.gz); None for pid-/gpu-
    files."""
    m = _DIAG_RANK.match(os.path.basename(path))
    return int(m.group(1)) if m else None
