"""Each step's own time from a tqdm bar's printed rates (the HF Trainer's training bar).

tqdm prints `n/total [elapsed<left, R]` with R the ratio of two exponential moving averages (smoothing
0.3, the Trainer's default) of the steps (dn) and the seconds (dt) between its displays, both updated on
each display (never on a redisplay by `tqdm.write`). The counts give each display's dn, so its dt follows
from its rate and the previous display's: the step times the bar smoothed away. The raw rate carries
earlier steps into later ones: a real 1-rank HF Trainer + DeepSpeed job (30 steps, CPU) printed 420 ms
at step 2 where its trace measured 256 ms; inverted, 247.6 ms (steps 3-30 within 2% of the trace, most
within 1%). A single slow step (a checkpoint save) spread by the average over the next ones reads as a
slow stretch.

Only one bar's displays can be inverted: a count shown again at another rate (a second rank's bar of the
same total), a count going back, or a rate the averages cannot produce (a bar with other smoothing) keep
the bar's own rates from then on. tqdm's closing display shows the run's mean rate: it is no step.
"""

from __future__ import annotations

SMOOTHING = 0.3  # tqdm's default, the Trainer's bar's


class BarTimes:
    """One bar's displays in order: `ms` gives each display's milliseconds per step."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0  # the count last displayed
        self.ema_dn = 0.0  # the averages before bias correction (tqdm's corrections cancel in the ratio)
        self.ema_dt = 0.0
        self.sec: float | None = None  # the rate (seconds per step) last displayed, and its step time
        self.ms: float | None = None
        self.mixed = False  # displays of more than one bar, or not tqdm's averages: rates as printed

    def step_ms(self, count: int, sec: float) -> float:
        """Milliseconds per step since the previous display, for a display of `count` at `sec` seconds
        per step (the bar's rate)."""
        if self.mixed:
            return sec * 1e3
        if count == self.n and self.ms is not None:
            if sec == self.sec or count == self.total:  # a redisplay, or the closing mean rate
                return self.ms
            return self._mixed(sec)
        if count <= self.n:
            return self._mixed(sec)
        a, b = SMOOTHING, 1.0 - SMOOTHING
        dn = count - self.n
        ema_dn = a * dn + b * self.ema_dn
        ema_dt = ema_dn * sec  # the rate shown is ema_dn / ema_dt
        dt = (ema_dt - b * self.ema_dt) / a if self.ema_dn else dn * sec  # the first: the rate itself
        if dt <= 0:
            return self._mixed(sec)
        self.n, self.ema_dn, self.ema_dt, self.sec, self.ms = count, ema_dn, ema_dt, sec, dt / dn * 1e3
        return self.ms

    def _mixed(self, sec: float) -> float:
        self.mixed = True
        return sec * 1e3
