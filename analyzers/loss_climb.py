"""A training loss that climbs steadily over many logged steps: divergence setting in slowly, which
no single step shows (a sudden jump is `loss_spike`'s, a nan `nan_loss`'s). Reads the log's step records
(`log_step`), in the framework's iteration numbers.

The curve is smoothed by a running median (a lone spike does not move it); a climb runs from the
lowest smoothed loss so far to a later one, and counts only when it is long, large against both the
loss and the run's noise, steady (most pairs of logged losses in it rise: Kendall's tau) and made of many
small rises rather than one jump."""

from __future__ import annotations

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

SMOOTH = 5  # running median of this many logged losses
CLIMB_MIN_LOGS = 10  # a climb spans at least this many logged losses after its lowest point
CLIMB_RISE = 0.15  # its smoothed end is this share above the lowest smoothed loss before it
CLIMB_TAU = 0.6  # Kendall's tau of loss against step over the climb: steady, not noise
CLIMB_JUMP = 0.5  # no single step-to-step rise in it is more than this share of the climb
CLIMB_NOISES = 6  # the climb is this many times the noise (robust deviation of the changes) ...
NOISE_BEFORE = 10  # ... in it, or in this many logged losses before it, whichever is larger


def tau(vals: np.ndarray) -> float:
    """Kendall's tau of `vals` against their order (ties count as neither)."""
    d = np.sign(vals[None, :] - vals[:, None])
    n = len(vals)
    return float(np.triu(d, 1).sum()) / (n * (n - 1) / 2) if n > 1 else 0.0


def _noise(diffs: np.ndarray) -> float:
    """1.4826 x the median absolute deviation of step-to-step changes / sqrt 2: a loss's own noise, its
    trend (a steady fall or climb) left out."""
    if len(diffs) < 2:
        return 0.0
    return 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / float(np.sqrt(2))


def climb(series: pd.DataFrame) -> dict[str, float] | None:
    """The largest climb that meets every margin, as {start_step, end_step, low, end, rise, tau,
    logs, to_end}; None when there is none."""
    vals = series["loss"].to_numpy(dtype=float)
    steps = series["step"].tolist()
    if len(vals) < SMOOTH + CLIMB_MIN_LOGS:
        return None
    smooth = pd.Series(vals).rolling(SMOOTH).median().to_numpy()
    best = None
    low = SMOOTH - 1  # index of the lowest smoothed loss so far
    for b in range(SMOOTH, len(vals)):
        if smooth[b - 1] < smooth[low]:
            low = b - 1
        a, base = low, smooth[low]
        if base <= 0 or b - a < CLIMB_MIN_LOGS:
            continue
        rise = smooth[b] / base - 1
        if rise < CLIMB_RISE or (best is not None and rise <= best["rise"]):
            continue
        span = vals[a : b + 1]
        diffs = np.diff(span)
        noise = max(_noise(diffs), _noise(np.diff(vals[max(0, a - NOISE_BEFORE) : a + 1])))
        t = tau(span)
        jump = float(diffs.max())
        up = smooth[b] - base
        if t < CLIMB_TAU or jump > CLIMB_JUMP * up or up < CLIMB_NOISES * noise:
            continue
        best = {
            "start_step": int(steps[a]),
            "end_step": int(steps[b]),
            "low": float(base),
            "end": float(smooth[b]),
            "rise": float(rise),
            "tau": t,
            "logs": b - a + 1,
            "largest_jump": jump,
            "noise": noise,
        }
    if best is not None:
        best["last"] = float(smooth[-1])
        best["to_end"] = bool(smooth[-1] >= best["low"] * (1 + CLIMB_RISE))
    return best


@rule("loss_climb")
def loss_climb(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when the logged training loss, smoothed by a running median of 5 logged losses, climbs
    from its lowest point so far by >= 15% over >= 10 logged losses, steadily (Kendall's tau of the
    losses in the climb against their order >= 0.60) and in small rises (no single step-to-step rise
    above 50% of the climb: that is a spike), by >= 6 times the noise (1.4826 x MAD of the
    step-to-step changes / sqrt 2, in the climb or in the 10 logged losses before it, the larger).
    Critical when the smoothed loss is still >= 15% above
    that lowest point at the end of the log. Fix: lower the learning rate and clip gradients, restart
    from the checkpoint before the climb began."""
    found = climb(loss_series.finite(trace))
    if found is None:
        return []
    going = found["to_end"]
    return [
        Finding(
            severity="critical" if going else "warning",
            title=(
                f"loss climbing since step {found['start_step']}: {found['low']:.4g} -> {found['end']:.4g} "
                f"(+{found['rise']:.0%}) by step {found['end_step']}, over {found['logs']} logged losses"
            ),
            detail=(
                f"the running median of {SMOOTH} logged losses rose {found['rise']:.0%} from its lowest "
                f"point, steadily (Kendall's tau {found['tau']:.2f}), the largest single rise "
                f"{found['largest_jump']:.3g}: the run is diverging slowly, not spiking; "
                + (
                    f"still {found['last']:.4g} at the end of the log."
                    if going
                    else f"back to {found['last']:.4g} by the end of the log."
                )
                + " A loss that rises while a sequence-length or batch-size warm-up lengthens the"
                " samples is expected: check the schedule first."
            ),
            evidence=found,
            steps=[found["start_step"], found["end_step"]],
            fixes=[
                *clip_fix(
                    trace, "lower the peak learning rate (or lengthen warm-up) and clip gradients at 1.0"
                ),
                Fix(
                    f"restart from the last checkpoint before step {found['start_step']} with the lower "
                    "learning rate, rather than training on from a diverging state"
                ),
            ],
        )
    ]
