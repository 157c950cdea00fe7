"""What an analysis concludes: `Finding` (one diagnosis with its evidence) and `Fix` (a change to try).

Core types: the rules (diag.analyzers) produce them, the report and the TUI show them, and neither of
those needs the rules to do so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "critical")
# the share of the time at stake (a step's, or the job's) a problem costs -> its severity, the same for
# every rule that can price itself: below 5% it is worth knowing, from 25% it dominates the run
WARNING_SHARE = 0.05
CRITICAL_SHARE = 0.25
# live (`diag watch`, `diag top`), a severity falls back only once the share is under this part of its
# threshold (critical under 15%, warning under 3%): a rank throttled 40 ms of every 100 ms cost its
# peers 19-40% of the wall time from one analysis to the next, and the watch printed the straggler
# again at each crossing of 25% (critical, warning, critical: 6-9 times in 40 s)
HOLD_SHARE = 0.6


def severity_of(share: float) -> str:
    """The severity of a problem costing `share` (0..1) of the time at stake."""
    if share >= CRITICAL_SHARE:
        return "critical"
    return "warning" if share >= WARNING_SHARE else "info"


def held_severity(severity: str, share: float | None, before: str | None) -> str:
    """Live, the severity to show for a priced finding (`severity` from its `share`) that was `before`
    at the previous analysis: a higher one is kept while the share stays at >= `HOLD_SHARE` of that
    severity's threshold. A rise shows at once. A severity a rule set otherwise (not its share's) is
    left as it is."""
    if not isinstance(share, (int, float)) or before not in SEVERITIES or severity != severity_of(share):
        return severity
    if SEVERITIES.index(before) <= SEVERITIES.index(severity):
        return severity
    floor = CRITICAL_SHARE if before == "critical" else WARNING_SHARE
    return str(before) if share >= HOLD_SHARE * floor else severity


@dataclass(frozen=True)
class Cost:
    """Time a problem costs out of the time at stake, measured: `lost_s` of every `total_s` step
    (`per` "step"), or in total of `total_s` described by `per` ("of recorded steps", "logged")."""

    lost_s: float
    total_s: float
    per: str = "step"

    @property
    def share(self) -> float:
        return min(max(self.lost_s / self.total_s, 0.0), 1.0) if self.total_s > 0 else 0.0

    @property
    def severity(self) -> str:
        return severity_of(self.share)

    @property
    def text(self) -> str:
        """The time lost, stated: "costs 12.0 ms of every 40.0 ms step (30%)", "costs 1.20 s of 60.00 s
        logged (2%)"."""
        of = f"every {_dur(self.total_s)} step" if self.per == "step" else f"{_dur(self.total_s)} {self.per}"
        return f"costs {_dur(self.lost_s)} of {of} ({self.share:.0%})"

    def evidence(self) -> dict[str, Any]:
        return {"time_lost_s": self.lost_s, "time_at_stake_s": self.total_s, "time_lost_share": self.share}


def _dur(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


@dataclass
class Fix:
    """A concrete change to try: a ds_config JSON patch, Megatron arguments, environment variables."""

    summary: str
    ds_config: dict[str, Any] | None = None
    megatron_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class Finding:
    """One diagnosis. `evidence` holds the numbers that triggered it; `recoverable_s` estimates the
    time per step (seconds) that the fix could win back, when it can be estimated. `rule` is filled
    by the rule registry (`@rule`) with the name the rule was registered under."""

    rule: str = ""
    severity: str
    title: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    ranks: list[int] = field(default_factory=list)
    layers: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    recoverable_s: float | None = None
    fixes: list[Fix] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ranked(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by the time a fix could win back."""
    order = {s: i for i, s in enumerate(reversed(SEVERITIES))}
    return sorted(findings, key=lambda f: (order.get(f.severity, 9), -(f.recoverable_s or 0)))
