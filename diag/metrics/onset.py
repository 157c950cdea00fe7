"""Where one rank turned slow mid-run: runs of steps on which it alone kept the others waiting,
after a stretch on which it was on par with them.

Why apart from the whole run's medians: a node that degrades at step 500 of 900 (thermal throttling,
another job landing on its host, a failing link) is the slowest rank on 44% of the steps and its
median compute is its healthy one, so the straggler rule's whole-run test never names it, live or
post-mortem, however large the excess. The change itself is the evidence: a level shift from on par
to a steady excess that stands far out of the job's own noise just before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from diag.metrics.steps import by_step_and_rank


@dataclass(frozen=True)
class Onset:
    """`rank` slow on each of `steps` (consecutive compared steps), on par over `baseline` before."""

    rank: int
    steps: list[int]
    gap_s: float  # its median excess of compute per step over the others', on those steps
    baseline: int  # compared steps before them
    baseline_gap_s: float  # its median excess before (about 0: on par)
    noise_s: float  # the baseline's noise the excess stands out of
    step_s: float  # the baseline's median step time
    ongoing: bool  # it lasts to the last compared step (or the one before: live, the newest step's
    # records may be still on their way from some rank)

    @property
    def first(self) -> int:
        return self.steps[0]


def robust_sigma(x: pd.Series) -> float:
    """1.4826 x the median absolute deviation: a sigma that one load spike does not move."""
    return float(1.4826 * (x - x.median()).abs().median()) if len(x) else 0.0


def slow_runs(slow_on: pd.Series, bridge: int = 1) -> list[tuple[int, int]]:
    """(start, length) of each run of True positions in `slow_on`, bridging up to `bridge` False
    positions between two True ones (one step a hiccup of a peer hides does not split a straggler's
    run in two, the second of which would then count the first as its slow baseline)."""
    runs: list[tuple[int, int]] = []
    start = end = None  # the current run: its first and last True position
    for i, flag in enumerate(slow_on.to_list()):
        if not flag:
            continue
        if start is not None and end is not None and i - end - 1 <= bridge:
            end = i
            continue
        if start is not None and end is not None:
            runs.append((start, end - start + 1))
        start = end = i
    if start is not None and end is not None:
        runs.append((start, end - start + 1))
    return runs


def onsets(
    df: pd.DataFrame,
    *,
    slower: float,
    min_share: float,
    waited: float,
    min_steps: int,
    baseline: int,
    margin: float,
    steady: float,
    min_excess_s: float,
) -> list[Onset]:
    """Each (rank, run of steps) where the rank turned slow: on each of >= `min_steps` consecutive
    compared steps it is the slowest, >= `slower` x the others' median compute, by >= `min_share`
    of the step, and the others wait for >= `waited` of that excess in collectives; over the
    (up to 5 x `baseline`) compared steps just before, >= `baseline` of them, its median excess
    was under `min_share` of the step (on par), and the run's median excess stands >= `margin`
    times out of that stretch's noise (the robust sigma of its excess and of the step time, the
    larger), and >= `steady` times out of its own noise over the run (a steady excess, not the
    scheduler's swings), and the run's excess adds up to >= `min_excess_s` (longer than the
    hiccups of a healthy host). One step between two slow ones does not end a run (`slow_runs`),
    and steps at its ends with under half its median excess are not part of it (`_trimmed`).

    `df`: `compute_per_step`'s rows (rank, step, dur_s, compute_s, wait_s)."""
    wide = by_step_and_rank(df, "compute_s").dropna()
    if wide.shape[1] < 2 or len(wide) < baseline + min_steps:
        return []
    wait = by_step_and_rank(df, "wait_s").reindex(index=wide.index)
    dur = df.groupby("step")["dur_s"].mean().reindex(wide.index)
    top = wide.idxmax(axis=1)
    found = []
    tops = top.value_counts()
    for rank in tops.index[tops >= min_steps]:  # a run needs it the slowest on each of its steps
        others = wide.drop(columns=rank).median(axis=1)
        gap = wide[rank] - others
        their_wait = wait.drop(columns=rank).median(axis=1)
        slow_on = (
            (top == rank)
            & (wide[rank] >= slower * others)
            & (gap >= min_share * dur)
            & (their_wait >= waited * gap)
        )
        for start, length in slow_runs(slow_on):
            if length < min_steps or start < baseline:
                continue
            start, length = _trimmed(gap.iloc[start : start + length], start)
            if length < min_steps or start < baseline:
                continue
            before, run = gap.iloc[max(0, start - 5 * baseline) : start], gap.iloc[start : start + length]
            level, base = float(run.median()), float(before.median())
            base_dur = dur.iloc[start - len(before) : start]
            step_s = float(base_dur.median())
            if base >= min_share * step_s:
                continue  # slow before too: the whole run's test, not a change
            noise = max(robust_sigma(before), robust_sigma(base_dur))
            if (
                level - base < margin * noise
                or level < steady * robust_sigma(run)
                or float(run.sum()) < min_excess_s
            ):
                continue
            ongoing = start + length >= len(wide) - 1
            found.append(
                Onset(
                    int(rank), [int(s) for s in run.index], level, len(before), base, noise, step_s, ongoing
                )
            )
    return found


def _trimmed(run: pd.Series, start: int) -> tuple[int, int]:
    """(start, length) of the run without the steps at its ends whose excess is under half its
    median: a bridged blip just before the change is not where it began."""
    big = (run >= 0.5 * float(run.median())).to_list()
    if True not in big:
        return start, 0
    first, last = big.index(True), len(big) - 1 - big[::-1].index(True)
    return start + first, last - first + 1
