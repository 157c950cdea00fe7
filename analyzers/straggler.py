"""Straggler rank: one rank computes slower and every other rank waits for it in the next collective."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from diag.analyzers import evidence
from diag.analyzers.base import rule
from diag.analyzers.memory_growth import memory_growth

from diag.findings import Cost, Finding, Fix
from diag.metrics import positions, rank_steps, reduction
from diag.metrics.comms import arrival_per_step, arrival_waits, last_per_step, transfer_dur
from diag.metrics.idle import gaps
from diag.metrics.onset import Onset, onsets, robust_sigma
from diag.metrics.sched import runq_per_step
from diag.metrics.selection import PerStep
from diag.metrics.steps import NS, by_step_and_rank
from diag.metrics.text import as_text
from diag.metrics.throttle import WINDOW_S, throttled_spans

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

# Thresholds sit above what host jitter and rank-0 duties produce on healthy runs (measured on the
# shared 2-core CI machine: up to 1.4x and 22% of the step), and far below a real slow rank.
SLOWER = 1.50  # the rank's median compute time vs the median of the other ranks
MIN_STEP_SHARE = 0.25  # and the difference is at least this share of the step
CONSISTENT = 0.60  # and it is the slowest rank in at least this share of steps
WAITED = 0.50  # and the other ranks wait in collectives at least half the gap
# steady, applied steps compared; fewer is no evidence of a persistent straggler. Not fewer: at load
# 15-17 a healthy DDP control's rank 0 was 1.6-13x slower on each of its first 4 compared steps (its
# peer waited 13-42 ms of 15-45 ms steps) before the gap fell to 4-7 ms; planted 80 ms stragglers were
# named after the job's 5th-6th step with 3 compared, after its 7th-8th with 5. Over 3 compared steps
# no margin parts them (load 5): the planted DDP, ZeRO-2 and TP stragglers' gaps stood at 10, 12 and
# 4.2 standard deviations of themselves, healthy DDP's rank 0 (2.8x slower on steps 2-4, 7 ms of
# 12 ms steps) at 4.5, a healthy ZeRO-3's rank 0 (55 ms, 41% of the step) at 3.8
MIN_STEPS = 5
# and not when its host's CPU is the cause: the slow rank's training thread waited runnable for a
# CPU (kernel run-queue wait) at least this share of the gap more per step than the others
# (`cpu_contended`: an info finding instead). Healthy DDP beside a busy process on the 2-core CI
# machine: rank 0 2.0x slower on every step, gap 3 ms; planted 80 ms stragglers sleep (no run queue)
CONTENDED = 0.50
# and the gap is this many times its noise (`step_noise`: the robust sigma of the per-step gap): CPU
# contention on the shared host made a ZeRO-2 control's rank 0 1.6x slower from mid-run (load 12, gap
# 1.4 sigma of itself) and a DDP control's rank 0 slower on every step (load 17, 1.6 sigma); planted 80 ms
# stragglers stood at 4.2-20 sigma of their gap
NOISE_MARGIN = 3.0
# with fewer steps (one profiled step), the arrival order at the collectives is the evidence:
LAST_SHARE = 0.80  # one rank arrives last (the others wait for it) at this share of its collectives
MIN_ARRIVALS = 20  # of at least this many collectives matched across the ranks
# GPU (Kineto) traces: the compute kernels' time per step is the rank's own work, whatever it waits
# for on the host or in collectives. Ranks that run the same compute kernels on a step (same names,
# same count: data parallelism) differ there only by their inputs or their device; GPUs of one model
# running identical kernels differ by a few percent
KERNEL_SLOWER = 1.20  # the rank's median compute-kernel time per step vs the other ranks' median
MIN_KERNEL_STEPS = 3  # compared steps (with their same kernels on every rank) at least
# A rank throttled from outside (the live watcher saw its process stopped and resumed again and again:
# a SIGSTOP/SIGCONT duty cycle, as cpulimit does). Its trace alone cannot tell it from a rank that lost
# the CPU to a loaded host: on healthy controls at load 12-17 the peer waited for the slower rank 0 at
# 79-100% of steps, 29-80% of the wall time, more than a 40%-of-100-ms throttle costs
STOPPED_SHARE = 0.10  # of the recent looks at the process, seen stopped (state T) at least
RESUMES = 3  # and resumed at least this many times (a cycle; a hang stays stopped: hang_desync's)
THROTTLE_WAITED = 0.10  # its peers waited for it (it arrived last) at least this share of the wall time
# and it is the rank most waited for: of all the waiting between the ranks over those steps, at least
# this share. Not more: a healthy ZeRO-2 run's rank 1 caused 63-67% of it before any stop (load 5),
# 62-71% once stopped 40 ms of every 100 ms (its peer then waited for it 23-35% of the wall time)
THROTTLE_CAUSED = 0.55
MIN_THROTTLE_STEPS = 3  # steps begun while the watcher looked, at least
# Live, a rank named throttled stays named until its premise falls well below these: under half the
# stopped share, resumes and wait share, under 40% of the waiting (the watcher marks the rank
# `named` in its process fact). The premise is measured over the last 5 s, so it falls that far only
# seconds after the stops end. Without it, the public DDP tutorial throttled 25 s was named and
# cleared four times: its share of the waiting swung across 55% (46-62%, the old durations' reading)
HOLD = 0.5
HOLD_CAUSED = 0.40
# A rank that turns slow mid-run (`diag.metrics.onset`): the whole run's medians stay its healthy
# ones (a planted 80 ms straggler from step 529 of 876 of a DDP job: named neither live nor
# post-mortem). Named from the change: slow by the thresholds above on each of >= 3 consecutive
# steps, after >= 20 compared steps on par, its excess >= 5x the noise of the 100 steps before,
# and those steps' excess summed >= 0.2 s. Healthy runs have short stretches of one rank 1.5-5x
# slower (GC, the OS, rank 0's epoch-end work: 3-9 steps, 0.9-7.6 ms over 1.4-2.1 ms steps, at most
# 51 ms in all, in 45 real traces of 160-51,000 steps at load 1-17); the planted straggler's 3 steps
# hold 245 ms. On a 1 s step a rank slower by a quarter is named after 3 steps too
ONSET_STEPS = 3
ONSET_BASELINE = 20
ONSET_MARGIN = 5.0
ONSET_EXCESS_S = 0.2


def async_tail_wait(c: pd.DataFrame, xfer: pd.Series | None = None) -> pd.Series:
    """Seconds each (rank, step) waited for late peers at its last async collective: the op's
    duration beyond its transfer time (the least duration over the group's members, `transfer_dur`).

    Why the last one: an async collective (DDP's bucket all-reduces, issued and waited by the C++
    Reducer) overlaps the rank's own work until someone waits for it, which no Python frame shows.
    The last one issued in a step is waited for right away (DDP's Reducer at the end of backward),
    so its wait is time the step lost; earlier ones overlap it and the rank's own work. `xfer`:
    `transfer_dur(c)` where computed already (`Metrics.transfer`)."""
    if c.empty or "async_op" not in c:
        return pd.Series(dtype=float)
    flag = c["async_op"].astype("boolean").fillna(False).astype(bool).to_numpy()
    if not flag.any():
        return pd.Series(dtype=float)
    xfer = transfer_dur(c) if xfer is None else xfer
    codes = pd.factorize(c["rank"], sort=True)[0]
    # ranks in chunks of bounded rows (`positions.rank_chunks`), vectorized within
    parts = [
        _tail_wait(c.iloc[rows], flag[rows], xfer.iloc[rows], codes[rows])
        for rows in positions.rank_chunks(codes)
    ]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts) if parts else pd.Series(dtype=float)


def _tail_wait(c: pd.DataFrame, flag: np.ndarray, xfer: pd.Series, codes: np.ndarray) -> pd.Series:
    """`async_tail_wait` of a chunk of ranks' calls (`xfer`: their transfer times, `codes`: their
    ranks' codes)."""
    dur = pd.to_numeric(c["dur"], errors="coerce")
    pick = flag & dur.notna().to_numpy()
    done = dur[pick]
    a = pd.DataFrame(
        {
            "rank": c["rank"][pick],
            "step": c["step"][pick],
            "end": pd.to_numeric(c["ts"])[pick] + done,
            "wait": (done - xfer[pick]).clip(lower=0) / NS,
        }
    )
    return last_per_step(a, "end", codes[pick]).set_index(["rank", "step"])["wait"]


@dataclass(frozen=True)
class TailWait(reduction.OfSteps):
    """`OfSteps(async_tail_wait)` (a Reduction, `diag.metrics.reduction`: each (rank, step)'s
    from that step's calls, windows' parts concatenate) on the transfer times the rule placed
    already (`Metrics.transfer`), not placed anew."""

    reduce: PerStep = async_tail_wait

    def of(self, metrics: Metrics) -> pd.Series:
        return async_tail_wait(metrics.comms, metrics.transfer)


@dataclass(frozen=True)
class ArrivalWaits(reduction.OfSteps):
    """`OfSteps(comms.arrival_waits)` on the calls the rule placed already (`Metrics.placement`)."""

    reduce: PerStep = arrival_waits

    def of(self, metrics: Metrics) -> pd.Series:
        return arrival_waits(metrics.comms, metrics.placement)


@dataclass(frozen=True)
class CommRanks:
    """The ranks of the trace's collectives (every call's, lone ones too): a set the windows unite."""

    def of(self, metrics: Metrics) -> frozenset:
        c = metrics.trace.comms
        return frozenset(c["rank"].dropna().unique().tolist()) if not c.empty and "rank" in c else frozenset()

    def merged(self, parts: list[frozenset]) -> frozenset:
        return frozenset().union(*parts)

    folds = True  # (its merged value is a part: a set)


@dataclass(frozen=True)
class ArrivalCalls:
    """What `_by_arrival` reads of the calls: their rank, group, step, ts and dur, concatenated in
    step order. Per call, not per step: `arrivals` pairs the k-th call of a (rank, group) over the
    whole trace, which no per-window figure gives. Asked for only with at most one step mark and
    fewer than `MIN_STEPS` steps (a profiled step: one window of the windowed pass)."""

    def of(self, metrics: Metrics) -> pd.DataFrame:
        return metrics.comms[["rank", "group", "step", "ts", "dur"]]  # a filter copies these only

    def merged(self, parts: list[pd.DataFrame]) -> pd.DataFrame:
        if len(parts) == 1:
            return parts[0]
        rows = [p for p in parts if len(p)]
        return pd.concat(rows, ignore_index=True) if len(rows) > 1 else (rows or parts)[0]


def compute_per_step(metrics: Metrics) -> pd.DataFrame:
    """Step time minus time blocked in collectives (blocking ones, and the wait at the step's last
    async one, `async_tail_wait`): what the rank itself spent (its own work). Once per rule
    (`Metrics.for_rule`): the rule's whole-run test and its GPU-kernel fallback both read it."""
    return metrics.for_rule(_compute_per_step)


def _compute_per_step(metrics: Metrics) -> pd.DataFrame:
    df, tail = metrics.blocked, metrics.reduce(TailWait())
    if df.empty and not tail.empty:  # no blocking collective at all (plain DDP)
        df = metrics.steady_steps[["rank", "step", "dur_s"]].assign(exposed_s=0.0)
    if df.empty:
        return df
    xfer = metrics.exposed["exposed_s"].to_numpy() if not metrics.exposed.empty else 0.0
    extra = rank_steps.looked_up(df, tail) if not tail.empty else 0.0
    df = df.assign(
        compute_s=(df["dur_s"] - df["exposed_s"] - extra).clip(lower=0),
        wait_s=(df["exposed_s"] - xfer + extra).clip(lower=0),
    )
    st = metrics.trace.steps
    skipped = st[st["applied"].astype(object).eq(False)] if "applied" in st else st.iloc[:0]
    # steps skipped for an fp16 overflow take a different path (no optimizer update) on some ranks
    return df[~rank_steps.among(df, skipped)]


def step_noise(df: pd.DataFrame, slow: int | None = None) -> float:
    """The noise the compute gap must stand out of: the robust sigma of the per-step gap itself (the
    slow rank's compute minus the others' median), given the slow rank; else of the step time.

    Why the gap's own noise, not the step time's: a rank that is itself slow (a slow device, extra
    work, a fixed delay) carries its excess on every step, so the gap is steady even when load makes
    every step swing. A rank slowed by a shared, overloaded host carries an excess that depends on
    whom the scheduler favours from step to step: the gap appears mid-run, grows and shrinks, and it
    is the peer's work that changes (measured on a ZeRO-2 control at load 12: rank 1's compute fell
    from 110 to 65 ms at step 8 while rank 0's stayed at 120 ms; gap 1.4 sigma of itself, 3.6 of the
    step time; planted 80 ms stragglers 5.3-7.2 sigma of their gap)."""
    if slow is not None:
        wide = by_step_and_rank(df, "compute_s")
        if slow in wide and wide.shape[1] >= 2:
            gap = (wide[slow] - wide.drop(columns=slow).median(axis=1)).dropna()
            if len(gap):
                return robust_sigma(gap)
    return robust_sigma(df.groupby("step")["dur_s"].mean())


def _last_arrival(metrics: Metrics) -> dict[int, float]:
    """Supporting evidence from the metrics: how often each rank arrived last at a collective."""
    return evidence.by_rank(metrics.stragglers.set_index("rank")["last_arrival_frac"])


def arrivals(c: pd.DataFrame) -> pd.DataFrame:
    """Per rank, over the collectives matched across their group's members (the k-th op of a group
    on each rank): how often it arrived last (shortest duration: the others were already waiting
    inside) and the others' total wait (their duration beyond the shortest) at those it was last."""
    cols = ["rank", "collectives", "last_share", "others_wait_s"]
    if c.empty:
        return pd.DataFrame(columns=cols)
    c = c[["rank", "group", "ts", "dur"]].sort_values("ts", kind="stable")  # these columns copied only
    k = c.groupby([c["rank"], as_text(c["group"])], observed=True).cumcount()
    wide = pd.DataFrame(
        {
            "g": as_text(c["group"]),
            "k": k,
            "rank": c["rank"],
            "dur": pd.to_numeric(c["dur"], errors="coerce"),
        }
    ).pivot_table(index=["g", "k"], columns="rank", values="dur", aggfunc="first")
    wide = wide[wide.notna().sum(axis=1) >= 2]
    if wide.empty:
        return pd.DataFrame(columns=cols)
    last = wide.idxmin(axis=1)
    wait = wide.sub(wide.min(axis=1), axis=0)
    rows = []
    for r in wide.columns:
        mine = wide[r].notna()
        at = mine & (last == r)
        others = wait.loc[at].drop(columns=r).median(axis=1).sum() / 1e9 if at.any() else 0.0
        rows.append(
            {
                "rank": int(r),
                "collectives": int(mine.sum()),
                "last_share": float(at.sum() / max(mine.sum(), 1)),
                "others_wait_s": float(others),
            }
        )
    return pd.DataFrame(rows, columns=cols)


def what_if(wait: pd.DataFrame, gap: pd.Series, slow: int) -> pd.Series:
    """Seconds each step would have been shorter had `slow` kept pace with its peers (the what-if
    replay of ByteDance's straggler study, from the trace alone): its own work the others' median
    (`gap`: its excess per step) would have spared them their wait for it, and the step ends when the
    last rank leaves the collective. So the step loses the others' wait (their median `wait_s`:
    duration in collectives beyond the transfer) but never more than the slow rank's excess: waits
    beyond it are other causes (noise, another late rank), and excess nobody waited for (the others
    were busy too) cost nothing. Steps where `slow` was no slower lose 0."""
    others = wait[wait["rank"] != slow].groupby("step")["wait_s"].median()
    lost = pd.concat([gap.clip(lower=0), others], axis=1, join="inner").min(axis=1)
    return lost.clip(lower=0)


def _cost(lost: pd.Series, step_s: pd.Series) -> Cost:
    """The time lost over the compared steps, of their total duration (the ranks' mean per step)."""
    at = step_s.reindex(lost.index).dropna()
    return Cost(float(lost.sum()), float(at.sum()), f"over {len(at)} steps")


def _priced(
    trace: Trace, slow: int, lost: pd.Series, step_s: pd.Series, title: str, said: str, ev: dict, steps: list
) -> Finding:
    """The finding, priced by the what-if (`lost` per step, of the steps' time `step_s`): its
    severity from that share, the time lost stated in the detail and the evidence."""
    cost = _cost(lost, step_s)
    hit = lost[lost > 0]
    host = trace.headers.get(slow, {}).get("host", "?")
    return Finding(
        severity=cost.severity,
        title=title,
        detail=(
            f"rank {slow} (host {host}) {said} Had it kept pace with its peers, {len(hit)} step(s) would be "
            f"shorter: it {cost.text}."
        ),
        evidence={
            **ev,
            "host": host,
            **cost.evidence(),
            "affected_steps": [int(s) for s in hit.index][:20],
            "lost_per_step_s": {int(s): float(v) for s, v in lost.items()},
        },
        ranks=[slow],
        steps=[int(s) for s in steps][:20],
        recoverable_s=float(lost.mean()) if not lost.empty else None,
        fixes=[_fix(host)],
    )


def _fix(host: str) -> Fix:
    return Fix(
        f"inspect host {host}: other processes, CPU/GPU throttling, a slow data shard; "
        "exclude it or rebalance",
        env={"NCCL_DEBUG": "INFO"},
    )


def _by_arrival(trace: Trace, metrics: Metrics) -> list[Finding]:
    """A single profiled step: a rank the others wait for at most collectives. Only then: over 2-4
    steps of a job diag follows from its start, the first steps are warm-up whose set-up work lands on
    one rank (a TP=2 job's rank 0 kept its peer waiting 256 ms in steps 0-1, then the planted 80 ms
    straggler on rank 1 took over), and arrival counts are not the wait (rank 0 arrived last at 69% of
    step 2's all-reduces, its peer waited 7 ms; rank 1 at 31%, 86 ms)."""
    c = metrics.reduce(ArrivalCalls())
    first = c.groupby("rank")["step"].transform("min") if not c.empty else None
    if first is not None and c["step"].nunique() > 1:  # a warm-up step before the one recorded
        c = c[c["step"] > first]
    arr = arrivals(c)
    arr = arr[arr["collectives"] >= MIN_ARRIVALS]
    late = arr[arr["last_share"] >= LAST_SHARE]
    if arr["rank"].nunique() < 2 or len(late) != 1:
        return []
    row = late.iloc[0]
    slow, steps = int(row["rank"]), metrics.steps
    nsteps = max(int(steps["step"].nunique()), 1) if not steps.empty else 1
    step_s = float(steps["dur_s"].median()) if not steps.empty else _span_s(metrics.reduce(ArrivalCalls()))
    waited = float(row["others_wait_s"]) / nsteps
    if step_s <= 0 or waited < MIN_STEP_SHARE * step_s:
        return []
    host = trace.headers.get(slow, {}).get("host", "?")
    # every wait the others had at the collectives it arrived last at is time the step lost
    cost = Cost(waited * nsteps, step_s * nsteps, f"over {nsteps} step(s)")
    return [
        Finding(
            severity=cost.severity,
            title=f"rank {slow} is a straggler: the others wait for it at {row['last_share']:.0%} of "
            "collectives",
            detail=(
                f"rank {slow} (host {host}) arrived last at {row['last_share']:.0%} of "
                f"{int(row['collectives'])} collectives; the other ranks waited {waited * 1e3:.1f} ms for it "
                f"per step ({waited / step_s:.0%} of the step): had it kept pace, it {cost.text}. Judged "
                "from arrival order: too few steps to compare each rank's own work."
            ),
            evidence={
                "last_share": float(row["last_share"]),
                "collectives": int(row["collectives"]),
                "others_wait_s": waited,
                "step_s": step_s,
                "steps": nsteps,
                "host": host,
                "last_arrival_frac": evidence.by_rank(arr.set_index("rank")["last_share"]),
                **cost.evidence(),
            },
            ranks=[slow],
            recoverable_s=waited,
            fixes=[_fix(host)],
        )
    ]


def kernel_compute(metrics: Metrics) -> pd.DataFrame:
    """GPU traces: seconds of compute kernels per (step, rank), over the steady steps on which every
    rank ran the same compute kernels (names and count): equal work, so a longer time is the rank's
    inputs or device, not its role (a pipeline stage, rank 0's extra kernels)."""
    k = metrics.trace.frame("kernel")
    if k.empty or "kind" not in k:
        return pd.DataFrame()
    k = k[(k["kind"].astype(str) == "compute") & k["step"].notna()]
    steady = metrics.steady_steps
    if not steady.empty:
        k = k[rank_steps.among(k, steady)]
    if k.empty or k["rank"].nunique() < 2:
        return pd.DataFrame()
    kinds = k.groupby(["step", "rank"], observed=True)["name"].agg(lambda s: tuple(sorted(s.astype(str))))
    same = kinds.groupby(level="step").agg(lambda s: s.nunique() == 1 and len(s) == k["rank"].nunique())
    t = k.groupby(["step", "rank"], observed=True)["dur"].sum().unstack("rank") / NS
    return t.loc[same[same].index].dropna()


def _by_kernels(trace: Trace, metrics: Metrics) -> list[Finding]:
    """GPU traces where waits hide the gap (many small collectives, host noise of a few ms): a rank
    whose compute kernels take >= 1.2x the others' on the same kernels, on most steps, by a fixed
    excess well out of its noise, which its peers waited for on some step."""
    t = kernel_compute(metrics)
    if t.shape[0] < MIN_KERNEL_STEPS or t.shape[1] < 2:
        return []
    med = t.median()
    slow = int(med.idxmax())
    others = float(med.drop(slow).median())
    gap = t[slow] - t.drop(columns=slow).median(axis=1)
    consistent = float((t.idxmax(axis=1) == slow).mean())
    if others <= 0 or med[slow] < KERNEL_SLOWER * others or consistent < CONSISTENT:
        return []
    if float(gap.median()) < NOISE_MARGIN * robust_sigma(gap):
        return []
    df = compute_per_step(metrics)
    lost = what_if(df, gap, slow) if not df.empty else pd.Series(dtype=float)
    if lost.empty or lost.sum() <= 0:  # nobody waited for it: its excess cost nothing
        return []
    return [
        _priced(
            trace,
            slow,
            lost,
            metrics.steady_steps.groupby("step")["dur_s"].mean(),
            f"rank {slow} is a straggler: {med[slow] / others:.2f}x the others' GPU compute time",
            f"spends {med[slow] * 1e3:.2f} ms a step in compute kernels against {others * 1e3:.2f} ms on "
            f"the other ranks, running the same kernels ({t.shape[0]} steps compared; the slowest on "
            f"{consistent:.0%}).",
            {
                "kernel_compute_s": evidence.by_rank(med),
                "ratio": float(med[slow] / others),
                "gap_s": float(gap.median()),
                "gap_noise_s": robust_sigma(gap),
                "slowest_share": consistent,
                "steps_compared": int(t.shape[0]),
            },
            list(t.index[t.idxmax(axis=1) == slow]),
        )
    ]


INPUT_SHARE = 0.50  # the slow rank's extra idle lead-in explains at least this share of its gap
INPUT_MIN_STEPS = 3  # measured on at least this many sampled steps (as idle_between_steps judges)


def input_bound(metrics: Metrics, slow: int, gap_s: float) -> bool:
    """The slow rank's excess is idle before its first forward (a data loader), measured on >= 3
    sampled steps with per-layer records: an input stall, which idle_between_steps names with its
    fix; the straggler rule then stays silent rather than say the same rank twice (it counts that
    lead-in as the rank's own work: a planted input stall read '2.87x the others' compute time')."""
    g = gaps(metrics)
    if g.empty or "first" not in g or gap_s <= 0:
        return False
    g = g[g["first"].notna()]
    idle = (g["gap_s"] - g["comm_gap_s"]).clip(lower=0).groupby(g["rank"]).median()
    seen = g.groupby("rank")["step"].size()
    if slow not in idle or seen.get(slow, 0) < INPUT_MIN_STEPS or len(idle) < 2:
        return False
    return float(idle[slow] - idle.drop(slow).median()) >= INPUT_SHARE * gap_s


def _duty(trace: Trace) -> dict[int, dict]:
    """Ranks the watcher saw stopped and resumed again and again: live, its `process` fact of the
    last 5 s; post-mortem (no such fact), the span of its looks kept in the trace directory where
    a 5 s window met the same thresholds (`throttled_spans`)."""
    facts = {int(r): h["process"] for r, h in trace.headers.items() if isinstance(h.get("process"), dict)}
    kept = throttled_spans(trace.proc, WINDOW_S, STOPPED_SHARE, RESUMES)
    facts.update({r: f for r, f in kept.items() if r not in facts})
    return {
        r: f
        for r, f in facts.items()
        if f.get("stopped_share", 0) >= STOPPED_SHARE * _hold(f) and f.get("resumes", 0) >= RESUMES * _hold(f)
    }


def _hold(fact: dict) -> float:
    """The share of each threshold a rank must meet: all of it, or `HOLD` once named (live)."""
    return HOLD if fact.get("named") else 1.0


def caused_wait(df: pd.DataFrame) -> pd.DataFrame:
    """Per step: which rank arrived last (the least `wait_s`) and the others' median wait for it."""
    w = by_step_and_rank(df, "wait_s").dropna()
    if w.shape[1] < 2:
        return pd.DataFrame(columns=["last", "waited_s"])
    last = w.idxmin(axis=1)
    waited = [float(w.loc[s].drop(r).median()) for s, r in last.items()]
    return pd.DataFrame({"last": last.astype(int), "waited_s": waited}, index=w.index)


def _throttled(trace: Trace, metrics: Metrics) -> list[Finding]:
    """A rank the watcher saw stopped >= 10% of its recent looks with >= 3 resumes, which its peers
    waited for over the steps begun meanwhile: >= 10% of their wall time, >= 55% of all the waiting.
    Stops that land on some steps and not others (a 40 ms stop every 100 ms on 10-100 ms steps)
    make neither a steady compute ratio nor a consistent last arrival; what they cost is the
    others' wait, summed over the window."""
    duty = _duty(trace)
    if not duty:
        return []
    if not metrics.calls:
        return []
    df, st = arrival_per_step(metrics.steady_steps, metrics.reduce(ArrivalWaits())), metrics.steps
    if df.empty or st.empty:
        return []
    found = []
    for slow, fact in duty.items():
        # the steps begun since the first stop seen (the watcher's recent looks): the throttled ones
        since = fact.get("first_stop_ns") or int(fact.get("checked_ns", 0) - fact.get("looked_s", 0) * NS)
        until = fact.get("last_stop_ns") or float("inf")  # post-mortem: the throttled span's end
        mine_st = st[st["rank"] == slow]
        begun = set(mine_st.loc[(mine_st["start"] >= since) & (mine_st["start"] <= until), "step"])
        win = df[df["step"].isin(begun)]
        if win["step"].nunique() < MIN_THROTTLE_STEPS or slow not in set(win["rank"]):
            continue
        cw = caused_wait(win)
        step_s = win.groupby("step")["dur_s"].mean().reindex(cw.index)
        wall, total = float(step_s.sum()), float(cw["waited_s"].sum())
        mine = float(cw.loc[cw["last"] == slow, "waited_s"].sum())
        caused = HOLD_CAUSED if fact.get("named") else THROTTLE_CAUSED
        if wall <= 0 or total <= 0 or mine < THROTTLE_WAITED * _hold(fact) * wall or mine < caused * total:
            continue
        # the what-if: had it not been stopped, its peers would not have waited for it where it
        # arrived last. Not its compute excess (`what_if`'s bound): a stop inside its own collective
        # shows in nobody's compute, and priced so the public DDP tutorial's throttle read 3% (info)
        # where its peers waited 23% of the wall time, then 5% (warning): named, cleared, named
        lost = cw["waited_s"].where(cw["last"] == slow, 0.0)
        found.append(
            _priced(
                trace,
                slow,
                lost,
                step_s,
                f"rank {slow} is a straggler: stopped from outside {fact['stopped_share']:.0%} of the time, "
                "its peers wait for it",
                f"was seen stopped at {fact['stopped_share']:.0%} of {fact['looked_s']:.1f} s of looks and "
                f"resumed {fact['resumes']} times (a SIGSTOP/SIGCONT duty cycle, as cpulimit "
                f"throttles); over the {len(cw)} steps begun meanwhile the others waited "
                f"{mine * 1e3:.0f} ms for it "
                f"({mine / wall:.0%} of the wall time, {mine / total:.0%} of all waiting).",
                {
                    "stopped_share": float(fact["stopped_share"]),
                    "resumes": int(fact["resumes"]),
                    "looked_s": float(fact["looked_s"]),
                    "others_wait_s": mine,
                    "waited_share": mine / wall,
                    "caused_share": mine / total,
                    "last_share": float((cw["last"] == slow).mean()),
                },
                list(cw.index[cw["last"] == slow]),
            )
        )
    return found


def cpu_contended(trace: Trace, metrics: Metrics, df: pd.DataFrame, slow: int, gap: float) -> Finding | None:
    """An info finding instead of a straggler when the slow rank's excess is its wait for a CPU:
    over the compared steps its training thread waited runnable (the kernel's run-queue wait, the
    agent's `sched` samples) >= `CONTENDED` of the gap more per step than the others' median. Its
    host is oversubscribed (other processes take its CPU); nothing in the job is slow."""
    runq = runq_per_step(trace.sched, metrics.steps)
    if runq.empty:
        return None
    compared = runq[runq.index.get_level_values("step").isin(set(df["step"]))]
    per_rank = compared.groupby(level="rank").mean()
    if slow not in per_rank or len(per_rank) < 2:
        return None
    extra = float(per_rank[slow] - per_rank.drop(slow).median())
    if extra < CONTENDED * gap:
        return None
    host = trace.headers.get(slow, {}).get("host", "?")
    return Finding(
        severity="info",
        title=f"rank {slow} is slower: its host's CPUs are oversubscribed",
        detail=(
            f"rank {slow} (host {host}) needs {gap * 1e3:.1f} ms a step more than the others, and its "
            f"training thread waited for a CPU {extra * 1e3:.1f} ms a step more than theirs (run queue): "
            "other processes on that host take its CPU. Nothing in the job itself is slow."
        ),
        evidence={"gap_s": gap, "runq_extra_s": extra, "runq_s": evidence.by_rank(per_rank)},
        ranks=[slow],
        fixes=[Fix("Keep other CPU-heavy processes off the training hosts (or pin the ranks' cores).")],
    )


def _span_s(c: pd.DataFrame) -> float:
    if c.empty:
        return 0.0
    ts = pd.to_numeric(c["ts"])
    return float((ts + pd.to_numeric(c["dur"])).max() - ts.min()) / 1e9


@rule("straggler")
def straggler(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when one rank's median compute time (step minus the time blocked in collectives:
    blocking ones, and the wait at the step's last async one, e.g. DDP's bucket all-reduces that the
    C++ Reducer waits for; the others wait for it inside collectives, so step times alone look
    equal) is >= 1.5x the other ranks' median, the gap is >= 25% of the step and >= 3x its noise (the
    robust sigma of the per-step gap: a rank itself slow carries a steady excess, one slowed by a
    shared overloaded host an excess that comes and goes with the scheduler, `step_noise`), it is the
    slowest in >= 60% of steps, and the other ranks wait in collectives (duration beyond the op's
    transfer time) for >= 50% of the gap. Steps skipped for an fp16 overflow are left out (their work
    differs between ranks by design); at least 5 steady applied steps are compared. Fix: check that
    host (thermal throttling, other processes, a slow disk or data shard), move the job off it, balance
    the data.
    With one step (one profiled step), the arrival order instead: one rank arrives last (shortest
    duration) at >= 80% of >= 20 collectives matched across the ranks, and the others wait for it
    >= 25% of the step. GPU traces where neither fires: one rank's compute kernels take >= 1.2x the
    others' median on the same kernels (names and count) over >= 3 steady steps, it is the slowest
    on >= 60% of them, its per-step excess >= 3x that excess's noise, and the others waited for it
    on some step.
    Not when the slow rank's extra idle lead-in before its first forward (measured on >= 3 sampled
    steps) is >= 50% of the gap: an input stall, idle_between_steps' finding (`input_bound`); nor
    when memory_growth names the slow rank: the memory it adds each step is its extra work. An
    info finding instead when its training thread waited runnable for a CPU (the kernel's run-queue
    wait, sampled by the agent) >= 50% of the gap more per step than the others: its host's CPUs are
    oversubscribed by other processes (`cpu_contended`).
    A rank that turns slow mid-run, which the whole run's medians hide (`_by_onset`): slow by the
    ratios above (>= 1.5x, >= 25% of the step, the others waiting >= 50% of it, the slowest) on
    each of >= 3 consecutive steps, after >= 20 compared steps on par (its excess under 25% of the
    step), its excess >= 5x the noise of the (up to 100) steps before and >= 3x its own noise
    over those steps (one step's hiccup between them bridged), and >= 200 ms of excess over those
    steps (healthy runs' short stretches of one slower rank added up to at most 51 ms). Named
    "since step N", priced over those steps.
    Priced as a what-if replay (`what_if`): per step, the others' wait for it, at most its excess,
    summed over the steps; severity from that share of the steps' time. recoverable_s: that, per step.
    Also a rank throttled from outside, which no ratio of its own work shows: `diag watch` saw its
    process stopped at >= 10% of its looks over the last 5 s and resumed >= 3 times (a SIGSTOP/SIGCONT
    duty cycle), and over >= 3 steps begun meanwhile the others waited for it (it arrived last at a
    collective, `arrival_wait`) >= 10% of the wall time, >= 55% of all the waiting between the ranks
    (`_throttled`). Once named live it stays named until below half those (40% of the waiting).
    Post-mortem from the looks the watch kept in the trace directory (proc-<host>.jsonl): the span
    where a 5 s window met the same thresholds. Without a watcher, nothing: the trace alone cannot
    tell it from a rank a loaded host slowed (healthy controls: the peer waited for rank 0 at 79-100%
    of steps, 29-80% of the wall time)."""
    if _ranks_seen(trace, metrics) < 2:  # every premise compares a rank with its peers
        return []
    return _throttled(trace, metrics) or _by_work(trace, metrics)


def _ranks_seen(trace: Trace, metrics: Metrics) -> int:
    """How many ranks recorded steps, collectives or kernels: what every premise compares. Checked
    first: on one rank's trace the per-step tables it would build are most of a small run's time."""
    seen: set[object] = set(metrics.reduce(CommRanks()))
    for df in (trace.steps, trace.frame("kernel")):
        if not df.empty and "rank" in df:
            seen.update(df["rank"].dropna().unique())
    return len(seen)


def _by_work(trace: Trace, metrics: Metrics) -> list[Finding]:
    """The rank's own work per step against the others' (the rule's first paragraph), else the
    fallbacks for one profiled step and GPU traces."""
    df = compute_per_step(metrics)
    if metrics.steps.empty or metrics.steps["step"].nunique() < MIN_STEPS:
        # one profiled step: one step mark, not a live job's first two (its first mark has no
        # duration; a ZeRO-3 control's rank 0 kept its peer waiting at 83% of step 2's collectives)
        marks = trace.steps
        one = marks.empty or marks["step"].nunique() <= 1
        return (_by_arrival(trace, metrics) if one else []) or _by_kernels(trace, metrics)
    if df.empty or df["rank"].nunique() < 2 or df["step"].nunique() < MIN_STEPS:
        return _by_kernels(trace, metrics)
    med = df.groupby("rank")["compute_s"].median()
    slow = int(med.idxmax())
    others = float(med.drop(slow).median())
    gap, step_s = float(med[slow]) - others, float(df["dur_s"].median())
    wide = by_step_and_rank(df, "compute_s")
    consistent = float((wide.idxmax(axis=1) == slow).mean()) if not wide.empty else 0.0
    waited = float(df[df["rank"] != slow].groupby("rank")["wait_s"].median().median())
    noise = step_noise(df, slow)
    if (
        others <= 0
        or gap < NOISE_MARGIN * noise
        or med[slow] < SLOWER * others
        or gap < MIN_STEP_SHARE * step_s
        or consistent < CONSISTENT
        or waited < WAITED * gap
    ):
        return _by_onset(trace, metrics, df) or _by_kernels(trace, metrics)
    return _judged(
        trace,
        metrics,
        df,
        wide,
        slow,
        gap,
        (
            f"rank {slow} is a straggler: {med[slow] / others:.2f}x the others' compute time",
            f"needs {med[slow] * 1e3:.1f} ms of its own work per step against {others * 1e3:.1f} ms "
            "elsewhere; the other ranks wait for it in collectives.",
            {
                "compute_s": evidence.by_rank(med),
                "ratio": float(med[slow] / others),
                "gap_s": gap,
                "step_s": step_s,
                "slowest_share": consistent,
                "others_wait_s": waited,
                "step_noise_s": noise,
                "last_arrival_frac": _last_arrival(metrics),
            },
            list(wide.index[wide.idxmax(axis=1) == slow]),
        ),
    )


def _judged(
    trace: Trace,
    metrics: Metrics,
    df: pd.DataFrame,
    wide: pd.DataFrame,
    slow: int,
    gap: float,
    said: tuple[str, str, dict, list],
) -> list[Finding]:
    """What the whole run's test and the onset's share once a rank is slow over the steps of `df`
    (`wide`: their compute per step and rank): silent for an input stall or a rank memory_growth
    names, an info finding when its host's CPUs are oversubscribed, else the finding (`said`: title,
    detail, evidence, steps), priced by the what-if over those steps."""
    if input_bound(metrics, slow, gap) or any(slow in f.ranks for f in memory_growth(trace, metrics)):
        return []
    contended = cpu_contended(trace, metrics, df, slow, gap)
    if contended is not None:
        return [contended]
    lost = what_if(df, wide[slow] - wide.drop(columns=slow).median(axis=1), slow)
    return [_priced(trace, slow, lost, df.groupby("step")["dur_s"].mean(), *said)]


def _by_onset(trace: Trace, metrics: Metrics, df: pd.DataFrame) -> list[Finding]:
    """A rank that turned slow mid-run (`ONSET_STEPS`...): the run of steps where it did that cost
    the most, judged and priced over those steps alone."""
    found = onsets(
        df,
        slower=SLOWER,
        min_share=MIN_STEP_SHARE,
        waited=WAITED,
        min_steps=ONSET_STEPS,
        baseline=ONSET_BASELINE,
        margin=ONSET_MARGIN,
        steady=NOISE_MARGIN,
        min_excess_s=ONSET_EXCESS_S,
    )
    if not found:
        return []
    o = max(found, key=lambda o: o.gap_s * len(o.steps))
    slow, run = o.rank, df[df["step"].isin(o.steps)]
    wide = by_step_and_rank(run, "compute_s")
    med = wide.median()
    others = float(med.drop(slow).median())
    return _judged(
        trace,
        metrics,
        run,
        wide,
        slow,
        o.gap_s,
        (
            f"rank {slow} is a straggler {_since(o)}: {med[slow] / max(others, 1e-9):.2f}x the others' "
            "compute time",
            f"needs {med[slow] * 1e3:.1f} ms of its own work per step against {others * 1e3:.1f} ms "
            f"elsewhere over the {len(o.steps)} steps from step {o.first}; over the {o.baseline} "
            f"steps before it was on par ({o.baseline_gap_s * 1e3:+.1f} ms, noise "
            f"{o.noise_s * 1e3:.1f} ms). The other ranks wait for it in collectives.",
            {
                "compute_s": evidence.by_rank(med),
                "ratio": float(med[slow] / max(others, 1e-9)),
                "gap_s": o.gap_s,
                "since_step": o.first,
                "slow_steps": len(o.steps),
                "baseline_steps": o.baseline,
                "baseline_gap_s": o.baseline_gap_s,
                "step_noise_s": o.noise_s,
            },
            o.steps,
        ),
    )


def _since(o: Onset) -> str:
    """ "since step N" while it lasts, else the steps it lasted."""
    return f"since step {o.first}" if o.ongoing else f"at steps {o.first}-{o.steps[-1]}"


# what the rule asks first: computed in the windowed pass's first pass (`reduction.early`)
reduction.early(lambda _trace: CommRanks())
