"""Seconds each rank's training thread waited for a CPU per step, from the agent's `sched` samples.

The kernel's run-queue wait (schedstat run_delay) is cumulative; the agent samples it with each
flush (at most every 0.5 s), so a step's share is the counter interpolated at the step's start and
end: over steps shorter than the samples' spacing that is the rank's average rate meanwhile, which
is what a steady competitor for its CPU (another process on its host) produces.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.metrics.steps import NS


def runq_per_step(sched: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """(rank, step) -> seconds runnable but waiting for a CPU, for the steps of `steps`
    (`steps.step_frame`: start, end) that lie within a rank's samples; empty without samples."""
    if sched.empty or steps.empty:
        return pd.Series(dtype=float)
    out = []
    for rank, s in sched.groupby("rank", sort=False):
        s = s.sort_values("ts", kind="stable")
        ts = pd.to_numeric(s["ts"]).to_numpy(dtype="int64")
        runq = pd.to_numeric(s["runq"]).to_numpy(dtype="float64")
        mine = steps[(steps["rank"] == rank) & (steps["start"] >= ts[0]) & (steps["end"] <= ts[-1])]
        if len(ts) < 2 or mine.empty:
            continue
        wait = (_at(mine["end"], ts, runq) - _at(mine["start"], ts, runq)) / NS
        out.append(pd.Series(wait, index=pd.MultiIndex.from_arrays([mine["rank"], mine["step"]])))
    return pd.concat(out) if out else pd.Series(dtype=float)


def _at(when: pd.Series, ts: np.ndarray, counter: np.ndarray) -> np.ndarray:
    """The cumulative counter interpolated at `when` (offsets from the first sample: epoch
    nanoseconds are past float64's exact integers)."""
    x = (pd.to_numeric(when).to_numpy(dtype="int64") - ts[0]).astype(float)
    return np.interp(x, (ts - ts[0]).astype(float), counter)


def wait_rise(sched: pd.DataFrame, steps: pd.DataFrame, slow: list[int], base: list[int]) -> float | None:
    """Seconds a step more that the job waited for a CPU on the `slow` steps than on the `base` ones:
    per step the most any rank waited (a synchronous step waits for its slowest rank), the medians
    of the two sets subtracted. None where the samples cover under half of either set's steps."""
    runq = runq_per_step(sched, steps)
    if runq.empty:
        return None
    worst = runq.groupby(level="step").max()
    medians = []
    for chosen in (slow, base):
        have = worst[worst.index.isin(chosen)]
        if not chosen or len(have) * 2 < len(set(chosen)):
            return None
        medians.append(float(have.median()))
    return medians[0] - medians[1]
