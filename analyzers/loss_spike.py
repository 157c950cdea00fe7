"""Loss spikes: a logged training loss far above the run's own recent loss. Reads the log's step
records (`log_step`), in the framework's iteration numbers; nan/inf losses are `nan_loss`'s.

Two judgements: from the 8th logged loss on, against a running baseline and the run's own noise; and
before that (a spike in the first steps, where there is too little history for either), only a loss
far above every loss logged before it, the first (the untrained model's) included: early training
falls fast, so a healthy early loss is seldom above all of those, let alone by half."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from diag.analyzers import loss_series
from diag.analyzers.base import rule
from diag.analyzers.loss_series import clip_fix

from diag.findings import Finding, Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

BASE_WINDOW = 5  # the running baseline: median of this many logged losses before the one judged
WINDOW = 20  # the noise: robust deviation of the step-to-step changes over this many before it
MIN_HISTORY = 8  # the running judgement starts at this many logged losses (warm-up losses fall fast)
SPIKE_RISE = 0.25  # a spike is above the baseline by this share of it ...
SPIKE_MADS = 6  # ... and by this many robust deviations (noise, below)
EARLY_FROM = 2  # before MIN_HISTORY: judged from this many logged losses before it
EARLY_RISE = 1.5  # an early spike is this many times the highest loss logged before it ...
EARLY_SPREADS = 3  # ... and above it by this many times the spread of those losses (max - min)


def spikes(series: pd.DataFrame) -> list[dict[str, float]]:
    """Each logged loss above its running baseline by the margins, as {step, loss, baseline, limit}.
    The noise is 1.4826 x the median absolute deviation of the step-to-step changes, / sqrt(2): a falling
    loss curve's trend does not count as noise. Before `MIN_HISTORY`, `early_spikes`."""
    out: list[dict[str, float]] = []
    vals, steps = series["loss"].to_numpy(dtype=float), series["step"].tolist()
    out += early_spikes(vals, steps)
    for i in range(MIN_HISTORY, len(vals)):
        base = float(np.median(vals[max(0, i - BASE_WINDOW) : i]))
        diffs = np.diff(vals[max(0, i - WINDOW) : i])
        noise = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2)
        limit = base + max(SPIKE_RISE * abs(base), SPIKE_MADS * noise)
        if vals[i] > limit:
            out.append({"step": int(steps[i]), "loss": float(vals[i]), "baseline": base, "limit": limit})
    return out


def early_spikes(vals: np.ndarray, steps: list[int]) -> list[dict[str, float]]:
    """The first logged losses (from the `EARLY_FROM`+1-th to the `MIN_HISTORY`-th): a spike is
    >= `EARLY_RISE` x the highest loss before it and above it by >= `EARLY_SPREADS` x the spread of
    those losses. The baseline is that highest loss. Positive losses only (a ratio needs them)."""
    out: list[dict[str, float]] = []
    for i in range(EARLY_FROM, min(MIN_HISTORY, len(vals))):
        before = vals[:i]
        top, low = float(before.max()), float(before.min())
        if low <= 0:
            return out
        limit = max(EARLY_RISE * top, top + EARLY_SPREADS * (top - low))
        if vals[i] > limit:
            found = {"step": int(steps[i]), "loss": float(vals[i]), "baseline": top, "limit": limit}
            out.append({**found, "early": True})
    return out


def _spike_fixes(trace: Trace) -> list[Fix]:
    return [
        *clip_fix(trace, "clip gradients at 1.0 and lower the peak learning rate (or lengthen warm-up)"),
        Fix(
            "if it recurs at the same samples: restart from the checkpoint before the spike and skip the "
            "batches around it (data order), as large runs do"
        ),
        Fix("lower Adam beta2 (0.95) or raise eps, which damps updates after rare large gradients"),
    ]


@rule("loss_spike")
def loss_spike(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a logged training loss rises above its running baseline (median of the 5 logged
    losses before it, judged from the 8th on) by >= 25% of the baseline and by >= 6 robust deviations
    of the step-to-step changes over the 20 before it (1.4826 x MAD / sqrt 2); or, among the first 8
    logged losses (from the 3rd: 2 before it), when it is >= 1.5x the highest loss logged before it
    and above it by >= 3 times the spread of those losses. Critical when the last logged loss is still
    above that limit (not recovered). Fix: gradient clipping, lower LR / longer warm-up, skip the
    batches, Adam beta2 0.95."""
    finite = loss_series.finite(trace)
    found = spikes(finite)
    if not found:
        return []
    worst = max(found, key=lambda s: s["loss"] / s["baseline"] if s["baseline"] > 0 else math.inf)
    last = float(finite["loss"].iloc[-1])
    recovered = last <= worst["limit"]
    early = bool(worst.get("early"))
    return [
        Finding(
            severity="warning" if recovered else "critical",
            title=(
                f"{'early ' if early else ''}loss spike at step {worst['step']}: {worst['loss']:.4g} against "
                + ("the highest loss logged before it, " if early else "a running baseline of ")
                + f"{worst['baseline']:.4g} ({worst['loss'] / worst['baseline']:.2f}x)"
            ),
            detail=(
                f"{len(found)} logged loss(es) above the running baseline by >= {SPIKE_RISE:.0%} and "
                f">= {SPIKE_MADS} robust deviations, or (in the first {MIN_HISTORY} logged) >= "
                f"{EARLY_RISE:g}x every loss before it; the last logged loss is {last:.4g} "
                + ("(recovered)." if recovered else "(not recovered by the end of the log).")
            ),
            evidence={
                "spikes": found[:20],
                "spike_count": len(found),
                "last_loss": last,
                "recovered": recovered,
                "logged_losses": len(finite),
            },
            steps=[s["step"] for s in found][:50],
            fixes=_spike_fixes(trace),
        )
    ]
