"""What an analysis concludes: `Finding` (one diagnosis with its evidence) and `Fix` (a change to try).

Core types: the rules (diag.analyzers) produce them, the report and the TUI show them, and neither of
those needs the rules to do so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "critical")


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
