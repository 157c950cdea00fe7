"""Steps counted from each rank's attach, put on one numbering across the ranks by their end times.

Where the job has no step counter diag can read (a plain torch loop whose optimizer keeps no count,
SGD without momentum, and no loop variable named like an iteration), each rank's agent counts steps
from 0 at its own attach (`step_origin` "attach"). `diag attach` injects the ranks one after the
other, so the same iteration had different numbers on different ranks: on a public 2-rank DDP
program, rank 0's step n was rank 1's step n-2 .. n+7 from one attach to the next. Every reader that
compares ranks step by step then paired different iterations (the per-step table's slowest against
fastest rank; `hang_desync` named a rank 10 steps behind that was not).

Ranks that train in lockstep end each step within a small part of a step of each other (the
gradients' all_reduce ends them), so each of a rank's step ends is matched to the nearest end on
the reference rank, and the offset most matches agree on is the rank's: where it holds for at least
half the matches within a quarter of the median step, the rank's step numbers are shifted by it.
A rank whose ends do not agree (no lockstep: an uneven pipeline, too few steps) keeps its numbers.
The shift is in each aligned rank's header (`step_offset`) for the report to say."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diag import schema
from diag.trace.model import Trace

ATTACH = "attach"  # `step_origin` of a count from 0 at attach (collectors/steps_origin.py)
NEAR = 0.25  # of the reference's median step: how close two matched step ends must be
AGREE = 0.5  # of a rank's matched ends that must agree on its offset
MIN_MATCHES = 3
OFFSET_KEY = schema.STEP_OFFSET  # set in an aligned rank's header: what was added to its step numbers


def attached(trace: Trace) -> bool:
    """Some rank of several counted its steps from its attach."""
    heads = trace.headers
    return len(heads) > 1 and any(h.get(schema.META_STEP_ORIGIN) == ATTACH for h in heads.values())


def align(trace: Trace) -> dict[int, int]:
    """Each attach-counted rank's steps shifted onto the reference rank's numbering (one counted by
    the job where there is one, else the lowest rank), all made non-negative; returns the shifts
    made (rank -> steps added)."""
    if not attached(trace):
        return {}
    shifts = shifts_of(trace.headers, trace.frames.get(schema.STEP))
    if shifts:
        for kind, df in trace.frames.items():
            trace.frames[kind] = _shifted(df, shifts)
        for rank, d in shifts.items():
            trace.headers[rank][OFFSET_KEY] = d
    return shifts


def shifts_of(heads: dict[int, dict[str, Any]], steps: pd.DataFrame | None) -> dict[int, int]:
    """`align`'s shifts (rank -> steps to add) from the headers and the step records alone (the
    windowed pass holds those whole: a job whose ranks need none is still read a window at a time)."""
    if steps is None or steps.empty or not {"rank", "step", "ts", "dur"} <= set(steps.columns):
        return {}
    ends = _ends(steps)
    if len(ends) < 2:
        return {}
    own = [r for r in ends if heads.get(r, {}).get(schema.META_STEP_ORIGIN) != ATTACH]
    ref = min(own) if own else min(ends)
    offsets = {ref: 0}
    for rank in ends:
        if rank != ref and rank not in own:
            off = _offset(ends[ref], ends[rank])
            if off is not None:
                offsets[rank] = -off
    # no negative step (-1 is "outside every step"): attach-counted ranks move up together; onto a
    # job's numbering, a rank that would go below it keeps its own
    if own:
        offsets = {r: d for r, d in offsets.items() if int(ends[r][1].min()) + d >= 0}
    low = min(int(ends[r][1].min()) + d for r, d in offsets.items())
    lift = -low if low < 0 else 0
    return {r: d + lift for r, d in offsets.items() if d + lift}


def _ends(steps: pd.DataFrame) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank: its steps' end times (ns, ascending) and their step numbers. Only the three
    columns read are copied (the step records sorted whole, twice, were the windowed pass's peak at
    256 ranks x 500 steps: ~170 bytes a rank-step)."""
    step = pd.to_numeric(steps["step"], errors="coerce")
    end = pd.to_numeric(steps["ts"], errors="coerce") + pd.to_numeric(steps["dur"], errors="coerce")
    keep = ((step >= 0) & end.notna()).to_numpy()
    st = pd.DataFrame(
        {"rank": steps["rank"].to_numpy()[keep], "end": end.to_numpy()[keep], "step": step.to_numpy()[keep]}
    ).sort_values(["rank", "end"], kind="stable")
    return {
        int(rank): (g["end"].to_numpy(dtype=float), g["step"].to_numpy(dtype=np.int64))
        for rank, g in st.groupby("rank", sort=True)
    }


def _offset(ref: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray]) -> int | None:
    """The step offset (other's number minus the reference's) most near step ends agree on; None
    where too few ends are near or they do not agree."""
    ref_end, ref_step = ref
    end, step = other
    if len(ref_end) < MIN_MATCHES or len(end) < MIN_MATCHES:
        return None
    near = NEAR * float(np.median(np.diff(ref_end))) if len(ref_end) > 1 else 0.0
    j = np.clip(np.searchsorted(ref_end, end), 1, len(ref_end) - 1)
    nearest = np.where(np.abs(ref_end[j - 1] - end) <= np.abs(ref_end[j] - end), j - 1, j)
    close = np.abs(ref_end[nearest] - end) <= near
    if close.sum() < MIN_MATCHES:
        return None
    values, counts = np.unique(step[close] - ref_step[nearest[close]], return_counts=True)
    best = int(np.argmax(counts))
    return int(values[best]) if counts[best] >= AGREE * close.sum() else None


def _shifted(df: pd.DataFrame, shifts: dict[int, int]) -> pd.DataFrame:
    """`df` with `shifts[rank]` added to the non-negative steps of those ranks' rows."""
    if df.empty or "rank" not in df.columns or "step" not in df.columns:
        return df
    step = pd.to_numeric(df["step"], errors="coerce")
    add = pd.to_numeric(df["rank"].map(shifts), errors="coerce").where(step >= 0).fillna(0)
    if not add.any():
        return df
    out = df.copy()
    shifted = step + add
    out["step"] = shifted.astype(df["step"].dtype) if df["step"].dtype.kind in "iuf" else shifted
    return out


__all__ = ["ATTACH", "OFFSET_KEY", "align", "attached", "shifts_of"]
