"""Each step's own time from a tqdm bar's printed rates (the HF Trainer's training bar).

tqdm prints `n/total [elapsed<left, R]` with R the ratio of two exponential moving averages (smoothing
0.3, the Trainer's default) of the steps (dn) and the seconds (dt) between its displays, both updated on
each display (never on a redisplay by `tqdm.write`). The counts give each display's dn, so its dt follows
from its rate and the previous display's: the step times the bar smoothed away. The raw rate carries
earlier steps into later ones: a real 1-rank HF Trainer + DeepSpeed job (30 steps, CPU) printed 420 ms
at step 2 where its trace measured 256 ms; inverted, 247.6 ms (steps 3-30 within 2% of the trace, most
within 1%). A single slow step (a checkpoint save) spread by the average over the next ones reads as a
slow stretch.

Every rank may print its own bar of the same total (transformers 5 under the deepspeed launcher and
torchrun), the displays interleaved in any order: a count shown again at another rate is another bar.
The displays of one count go to the bars below it so that the bars' step times agree best (the ranks
run in lockstep), then so that each bar's changes least; the step's time is their mean. A real 2-rank
run's log (tests/fixtures/hf_2rank_bars) read as one bar said 775 ms for step 2 (one rank's average
still holding the 1.48 s it waited at step 1), a median of 341 ms; its trace 283 and 258 ms; told
apart 273 and 259.6 ms, every step within 4%, and a 400-step run's step times add up to 134.96 s where
its Trainer says 135.9 s (the averages: 130.93 s). A redisplay (same count and rate) is the same step;
tqdm's closing display shows the run's mean rate: no step either. More bars than `MAX_BARS`, or
displays no bar can show: the rates as printed.
"""

from __future__ import annotations

import math
from itertools import permutations

SMOOTHING = 0.3  # tqdm's default, the Trainer's bar's
MAX_BARS = 64  # bars of one total told apart (one per rank printing); beyond, the rates as printed


class Bar:
    """One bar's averages after its last display: count, tqdm's two moving averages (before bias
    correction: the corrections cancel in their ratio), its rate and its step time (ms)."""

    __slots__ = ("ema_dn", "ema_dt", "ms", "n", "sec")

    def __init__(
        self, n: int = 0, ema_dn: float = 0.0, ema_dt: float = 0.0, sec: float = 0.0, ms: float = 0.0
    ):
        self.n, self.ema_dn, self.ema_dt, self.sec, self.ms = n, ema_dn, ema_dt, sec, ms

    def after(self, count: int, sec: float) -> Bar | None:
        """The bar after a display of `count` at `sec` seconds per step; None when its averages cannot
        show that rate (the display is another bar's)."""
        a, b = SMOOTHING, 1.0 - SMOOTHING
        dn = count - self.n
        if dn <= 0:
            return None
        ema_dn = a * dn + b * self.ema_dn
        ema_dt = ema_dn * sec  # the rate shown is ema_dn / ema_dt
        dt = (ema_dt - b * self.ema_dt) / a if self.ema_dn else dn * sec  # the first: the rate itself
        return Bar(count, ema_dn, ema_dt, sec, dt / dn * 1e3) if dt > 0 else None


class BarTimes:
    """The displays of the bars of one total, in order: `step_ms` gives each step's milliseconds."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bars: list[Bar] = []
        self.mixed = False  # more bars than MAX_BARS, or displays no bar can show: rates as printed
        self.at = -1  # the count whose displays are being read, the bars before its first, its rates
        self.before: list[Bar] = []
        self.rates: list[float] = []
        self.value = 0.0  # the step time of count `at` (ms): its bars' mean
        self.revised: float | None = None  # the value this display replaced (a second bar's rate)

    def step_ms(self, count: int, sec: float) -> float:
        """The milliseconds per step of `count`'s step, for a display of `count` at `sec` seconds per
        step (the bar's rate); `revised` says which value it replaces, when a second bar's display
        of the count changes which display is whose."""
        self.revised = None
        if self.mixed:
            return sec * 1e3
        for bar in self.bars:  # a redisplay, or the closing mean rate
            if bar.n == count and (bar.sec == sec or count == self.total):
                return self.value if count == self.at else bar.ms
        if count != self.at:
            self.at, self.before, self.rates = count, list(self.bars), []
        self.rates.append(sec)
        bars = _assign(self.before, count, self.rates)
        if bars is None:
            self.mixed = True
            return sec * 1e3
        previous, self.bars = self.value, bars
        shown = [b.ms for b in bars if b.n == count]
        self.value = sum(shown) / len(shown)
        if len(self.rates) > 1:
            self.revised = previous
        return self.value


def _assign(before: list[Bar], count: int, rates: list[float]) -> list[Bar] | None:
    """The bars after `rates` (the displays of `count`, one per bar): each display continues a bar
    that was below `count`, the bars' step times agreeing best (then each changing least); displays
    beyond those bars start new ones. None when no assignment can show the rates."""
    free = [i for i, b in enumerate(before) if b.n < count]
    own = rates[: len(free)]
    bars = list(before)
    if len(free) == 1 and own:  # one bar to continue, no choice to score: a lone bar's every display
        bar = before[free[0]].after(count, own[0])
        if bar is None:
            return None
        bars[free[0]] = bar
    elif own:
        pick = _best(before, free, own, count)
        if pick is None:
            return None
        for i, r in zip(pick, own):
            bars[i] = before[i].after(count, r) or bars[i]
    for r in rates[len(free) :]:
        if len(bars) >= MAX_BARS:
            return None
        fresh = Bar().after(count, r)
        if fresh is None:
            return None
        bars.append(fresh)
    return bars


def _best(before: list[Bar], free: list[int], own: list[float], count: int) -> tuple[int, ...] | None:
    """The bars of `free` the displays `own` continue, in turn: the bars' step times agreeing best,
    then each changing least (the first such); None when no choice shows the rates, or there are too
    many to try."""
    best: tuple[float, float, tuple[int, ...]] | None = None
    if len(own) <= 4 and len(free) <= 8:
        for pick in permutations(free, len(own)):
            nxt = [before[i].after(count, r) for i, r in zip(pick, own)]
            if any(b is None for b in nxt):
                continue
            ms = [b.ms for b in nxt if b is not None]
            score = (max(ms) / min(ms), sum(abs(math.log(m / before[i].ms)) for i, m in zip(pick, ms)), pick)
            best = score if best is None or score[:2] < best[:2] else best
    return None if best is None else best[2]
