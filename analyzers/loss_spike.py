"""Loss spikes: a logged training loss far above the run's own recent loss. Reads the log's step
records (`log_step`), in the framework's iteration numbers; nan/inf losses are `nan_loss`'s."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from diag.analyzers.base import rule

from diag.findings import Finding, Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

BASE_WINDOW = 5  # the running baseline: median of this many logged losses before the one judged
WINDOW = 20  # the noise: robust deviation of the step-to-step changes over this many before it
MIN_HISTORY = 8  # no judgement before this many logged losses (warm-up losses fall fast)
SPIKE_RISE = 0.25  # a spike is above the baseline by this share of it ...
SPIKE_MADS = 6  # ... and by this many robust deviations (noise, below)


def losses(trace: Trace) -> pd.DataFrame:
    """One row per logged iteration: step, loss (first rank that printed it), nonfinite flag (see
    `diag.importers.logs.records`: a printed nan/inf, not a line without a loss)."""
    log = trace.frame("log_step")
    if log.empty or "loss" not in log.columns:
        return pd.DataFrame(columns=["step", "loss", "nonfinite"])
    d = log[["step", "loss"]].assign(
        loss=pd.to_numeric(log["loss"], errors="coerce"),
        nonfinite=(
            log["loss_nonfinite"].astype("boolean").fillna(False)
            if "loss_nonfinite" in log.columns
            else False
        ),
    )
    d = d[d["loss"].notna() | d["nonfinite"]]
    return d.sort_values("step", kind="stable").groupby("step", as_index=False).first()


def spikes(series: pd.DataFrame) -> list[dict[str, float]]:
    """Each logged loss above its running baseline by the margins, as {step, loss, baseline, limit}.
    The noise is 1.4826 x the median absolute deviation of the step-to-step changes, / sqrt(2): a falling
    loss curve's trend does not count as noise."""
    out: list[dict[str, float]] = []
    vals, steps = series["loss"].to_numpy(dtype=float), series["step"].tolist()
    for i in range(MIN_HISTORY, len(vals)):
        base = float(np.median(vals[max(0, i - BASE_WINDOW) : i]))
        diffs = np.diff(vals[max(0, i - WINDOW) : i])
        noise = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2)
        limit = base + max(SPIKE_RISE * abs(base), SPIKE_MADS * noise)
        if vals[i] > limit:
            out.append({"step": int(steps[i]), "loss": float(vals[i]), "baseline": base, "limit": limit})
    return out


def _spike_fixes() -> list[Fix]:
    return [
        Fix(
            "clip gradients and lower the peak learning rate (or lengthen warm-up)",
            ds_config={"gradient_clipping": 1.0},
            megatron_args=["--clip-grad 1.0"],
        ),
        Fix(
            "if it recurs at the same samples: restart from the checkpoint before the spike and skip the "
            "batches around it (data order), as large runs do"
        ),
        Fix(
            "lower Adam beta2 (0.95) or raise eps, which damps updates after rare large gradients",
            megatron_args=["--adam-beta2 0.95"],
        ),
    ]


@rule("loss_spike")
def loss_spike(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a logged training loss rises above its running baseline (median of the 5 logged
    losses before it, judged from the 8th on) by >= 25% of the baseline and by >= 6 robust deviations
    of the step-to-step changes over the 20 before it (1.4826 x MAD / sqrt 2). Critical when the last
    logged loss is still above that limit (not recovered). Fix: gradient clipping, lower LR / longer
    warm-up, skip the batches, Adam beta2 0.95."""
    series = losses(trace)
    finite = series[~series["nonfinite"]] if not series.empty else series
    found = spikes(finite)
    if not found:
        return []
    worst = max(found, key=lambda s: s["loss"] / s["baseline"] if s["baseline"] > 0 else math.inf)
    last = float(finite["loss"].iloc[-1])
    recovered = last <= worst["limit"]
    return [
        Finding(
            severity="warning" if recovered else "critical",
            title=(
                f"loss spike at step {worst['step']}: {worst['loss']:.4g} against a running baseline of "
                f"{worst['baseline']:.4g} ({worst['loss'] / worst['baseline']:.2f}x)"
            ),
            detail=(
                f"{len(found)} logged loss(es) above the running baseline by >= {SPIKE_RISE:.0%} and "
                f">= {SPIKE_MADS} robust deviations; the last logged loss is {last:.4g} "
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
            fixes=_spike_fixes(),
        )
    ]
