"""Throughput drops and regressions over a run, from the step times (or rates) its log prints.

Reads the log's step records (`log_step`): `iter_ms` (printed, or from the lines' timestamps), else
the printed samples/s or tokens/s. The first logged record is warm-up (compilation, allocator growth)
and is left out. Traces have their own step rules; this one judges what the log states."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix, severity_of
from diag.metrics.sched import wait_rise

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

MIN_RECORDS = 10  # logged records (after warm-up) needed before judging a run
SLOW = 1.5  # a record this many times the run's median step time is slow ...
MIN_SLOW_RUN = 3  # ... and a drop is this many consecutive slow records (one slow record: a checkpoint)
REGRESSION = 1.25  # the last third's median step time over the first third's
CONTENDED = 0.5  # a rise in the wait for a CPU this share of the step time's rise explains it


def step_cost(trace: Trace) -> tuple[pd.DataFrame, str]:
    """step and cost per logged record (ms per step, or the inverse of a rate), and which figure."""
    log = trace.frame("log_step")
    for col, inverse in (
        ("iter_ms", False),
        ("samples_per_sec", True),
        ("tokens_per_sec", True),
        ("tokens_per_sec_per_gpu", True),
    ):
        if col in log.columns:
            v = pd.to_numeric(log[col], errors="coerce")
            ok = v.notna() & (v > 0)
            if ok.sum() > 0:
                d = pd.DataFrame(
                    {
                        "step": log.loc[ok, "step"].astype(int),
                        "cost": (1.0 / v[ok]) if inverse else v[ok],
                        "value": v[ok],
                    }
                )
                return d.groupby("step", as_index=False).max().sort_values("step"), col
    return pd.DataFrame(columns=["step", "cost", "value"]), ""


def slow_runs(d: pd.DataFrame, median: float) -> list[list[int]]:
    """Index runs of >= MIN_SLOW_RUN consecutive records at >= SLOW x the median cost."""
    runs: list[list[int]] = []
    cur: list[int] = []
    for i, c in enumerate(d["cost"].tolist()):
        if c >= SLOW * median:
            cur.append(i)
            continue
        if len(cur) >= MIN_SLOW_RUN:
            runs.append(cur)
        cur = []
    if len(cur) >= MIN_SLOW_RUN:
        runs.append(cur)
    return runs


def _fixes(trace: Trace, growing: bool) -> list[Fix]:
    """Where to look for a slow window; for a slowdown that grows over the run (a regression, not a
    drop: its premise is measured only there) also fragmentation, with CUDA's allocator setting
    unless the trace shows the job on CPU (no CUDA allocator: the setting changes nothing)."""
    fixes = [
        Fix(
            "compare the slow steps' window with the hosts' logs: thermal throttling, a co-tenant, a "
            "failing link or NIC; `diag attach` the job while it is slow to see which rank lags"
        )
    ]
    if not growing:
        return fixes
    if _on_cpu(trace):
        fixes.append(
            Fix(
                "a slowdown that grows over the run is often a growing Python-side structure: "
                "watch host memory"
            )
        )
    else:
        fixes.append(
            Fix(
                "a slowdown that grows over the run is often memory fragmentation or a growing Python-side "
                "structure: try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and watch host memory",
                env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            )
        )
    return fixes


def _contended(
    trace: Trace, metrics: Metrics, col: str, slow: list[int], base: list[int], rise_ms: float
) -> float | None:
    """How much longer (ms a step) the job waited for a CPU on the `slow` steps than on the `base`
    ones, where that explains >= `CONTENDED` of their step time's `rise_ms`: other processes on the
    hosts took the ranks' CPUs (the agent's `sched` samples, on the trace's steps the log's are joined
    to; a log alone has none). None otherwise, or where the log prints no step times."""
    if col != "iter_ms" or rise_ms <= 0 or trace.sched.empty:
        return None
    joined = trace.frame("step_join")  # log step + log_shift = trace step (importers/join.py)
    k = int(joined["log_shift"].iloc[0]) if "log_shift" in joined.columns and len(joined) else 0
    rise = wait_rise(trace.sched, metrics.steps, [s + k for s in slow], [s + k for s in base])
    if rise is None or rise * 1e3 < CONTENDED * rise_ms:
        return None
    return rise * 1e3


def _busy_host(waited_ms: float, rise_ms: float) -> tuple[str, dict[str, float], list[Fix]]:
    """The sentence, evidence and fix of a slowdown that the ranks' wait for a CPU explains."""
    return (
        f" The ranks waited for a CPU {waited_ms:.0f} ms a step more meanwhile (run queue; the steps took "
        f"{rise_ms:.0f} ms more): other processes on the hosts took their CPUs.",
        {"runq_rise_ms": waited_ms},
        [Fix("keep other CPU-heavy processes off the training hosts (or pin the ranks' cores)")],
    )


def _on_cpu(trace: Trace) -> bool:
    """Every rank's recorded memory device is the CPU (a trace's; a log's rows name no device)."""
    dev = trace.memory["device"].dropna().astype(str) if "device" in trace.memory.columns else None
    return dev is not None and not dev.empty and bool(dev.str.lower().str.startswith("cpu").all())


def _priced(d: pd.DataFrame, col: str, excess: float) -> tuple[str, str, dict[str, float]]:
    """(severity, the time lost stated, evidence) of `excess` step cost over the logged run's total:
    seconds where the log prints step times, a share of the run where it prints only rates."""
    total = float(d["cost"].sum())
    if col == "iter_ms":
        cost = Cost(excess / 1e3, total / 1e3, "logged")
        return cost.severity, cost.text, cost.evidence()
    share = excess / total if total > 0 else 0.0
    return severity_of(share), f"costs {share:.0%} of the logged run's time", {"time_lost_share": share}


def _describe(d: pd.DataFrame, col: str, i: int) -> str:
    v = float(d["value"].iloc[i])
    return f"{v:.4g} ms/step" if col == "iter_ms" else f"{v:.4g} {col.replace('_per_', '/')}"


@rule("throughput_drop")
def throughput_drop(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires, from >= 10 logged records after the first (warm-up), on a drop: >= 3 consecutive records
    whose step time is >= 1.5x the run's median; or a regression: the last third's median step time
    >= 1.25x the first third's. Rates (samples/s, tokens/s) stand in for times when no time is printed.
    Fix: find the slow window's cause (host, link, co-tenant; `diag attach` while slow); for a
    regression also fragmentation: expandable_segments (not on a CPU job). Severity: the excess step
    time's share of the logged run. With a diag trace beside the log: where the ranks' wait for a CPU
    (the agent's run-queue samples; per step the most any rank waited) rose by >= 50% of the step
    time's rise over the same steps, other processes on the hosts took their CPUs: an info finding
    that says so, whose fix is the host's, not the job's."""
    d, col = step_cost(trace)
    d = d.iloc[1:].reset_index(drop=True)
    if len(d) < MIN_RECORDS:
        return []
    median = float(d["cost"].median())
    third = len(d) // 3
    early, late = float(d["cost"].iloc[:third].median()), float(d["cost"].iloc[-third:].median())
    found: list[Finding] = []
    runs = slow_runs(d, median)
    if runs:
        worst = max(runs, key=lambda r: float(d["cost"].iloc[r].sum()))
        steps = [int(d["step"].iloc[i]) for r in runs for i in r]
        peak = max(worst, key=lambda i: float(d["cost"].iloc[i]))
        slow = [i for r in runs for i in r]
        excess = float((d["cost"].iloc[slow] - median).clip(lower=0).sum())
        # per step of the run, as every rule's recoverable_s: the slow records' excess over all the
        # records (it was the worst stretch's excess per slow step: "~98 ms per step" for 1.82 s
        # over a 299-step run)
        rec_s = excess / len(d) / 1e3 if col == "iter_ms" else None
        sev, lost, ev = _priced(d, col, excess)
        others = [int(x) for i, x in enumerate(d["step"]) if i not in slow]
        rise = float(d["cost"].iloc[slow].median()) - median
        waited = _contended(trace, metrics, col, [int(d["step"].iloc[i]) for i in slow], others, rise)
        busy, busy_ev, fixes = (
            _busy_host(waited, rise) if waited is not None else ("", {}, _fixes(trace, False))
        )
        found.append(
            Finding(
                severity="info" if busy else sev,
                title=(
                    f"throughput drop over steps {d['step'].iloc[worst[0]]}-{d['step'].iloc[worst[-1]]}: "
                    f"{float(d['cost'].iloc[peak]) / median:.2f}x the run's median step time"
                ),
                detail=(
                    f"{len(runs)} stretch(es) of >= {MIN_SLOW_RUN} logged records at >= {SLOW:g}x the median "
                    f"({_describe(d, col, peak)} at step {int(d['step'].iloc[peak])}; figure: {col}); "
                    f"the slow stretches' excess {lost}.{busy}"
                ),
                evidence={
                    **ev,
                    **busy_ev,
                    "figure": col,
                    "median_cost": median,
                    "runs": [[int(d["step"].iloc[i]) for i in r] for r in runs][:10],
                    "worst_ratio": float(d["cost"].iloc[peak]) / median,
                    "records": len(d),
                },
                steps=steps[:50],
                recoverable_s=rec_s,
                fixes=fixes,
            )
        )
    if early > 0 and late >= REGRESSION * early:
        sev, lost, ev = _priced(d, col, float((d["cost"].iloc[-third:] - early).clip(lower=0).sum()))
        first, last = (
            [int(x) for x in d["step"].iloc[part]] for part in (slice(None, third), slice(-third, None))
        )
        waited = _contended(trace, metrics, col, last, first, late - early)
        busy, busy_ev, fixes = (
            _busy_host(waited, late - early) if waited is not None else ("", {}, _fixes(trace, True))
        )
        found.append(
            Finding(
                severity="info" if busy else sev,
                title=(
                    "throughput regressed over the run: the last third's steps are "
                    f"{late / early:.2f}x slower"
                ),
                detail=(
                    f"median step cost {early:.4g} over the first {third} logged records, {late:.4g} over "
                    f"the last {third} (figure: {col}, {'ms' if col == 'iter_ms' else 'inverse rate'}); "
                    f"the slowdown {lost}.{busy}"
                ),
                evidence={
                    **ev,
                    **busy_ev,
                    "figure": col,
                    "early_median": early,
                    "late_median": late,
                    "ratio": late / early,
                    "records": len(d),
                },
                steps=[int(s) for s in d["step"].iloc[-third:]][:50],
                recoverable_s=(late - early) / 1e3 if col == "iter_ms" else None,
                fixes=fixes,
            )
        )
    return found
