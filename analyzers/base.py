"""The Finding type and the rule registry.

A rule module decorates one function with `@rule("name", doc=...)`; the registry refuses a second rule
of the same name. Rule modules are listed in `RULE_MODULES` and imported by `run_all`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.trace.model import Trace

SEVERITIES = ("info", "warning", "critical")

# Every rule module, in report order. A rule module that fails to import is reported, not fatal.
RULE_MODULES: list[str] = [
    "diag.analyzers.hang_desync", "diag.analyzers.zero3_slow_link", "diag.analyzers.tp_cross_node",
    "diag.analyzers.overflow_storm", "diag.analyzers.memory_pressure", "diag.analyzers.embedding_comm",
    "diag.analyzers.straggler", "diag.analyzers.exposed_comm", "diag.analyzers.pipeline_bubble",
    "diag.analyzers.tiny_collectives", "diag.analyzers.idle_between_steps",
]


@dataclass
class Fix:
    """A concrete change to try: a ds_config JSON patch, Megatron arguments, environment variables."""

    summary: str
    ds_config: dict[str, Any] | None = None
    megatron_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Finding:
    """One diagnosis. `evidence` holds the numbers that triggered it; `recoverable_s` estimates the
    time per step (seconds) that the fix could win back, when it can be estimated."""

    rule: str
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


RuleFn = Callable[["Trace"], list[Finding]]
_RULES: dict[str, tuple[RuleFn, str]] = {}


def rule(name: str, doc: str = "") -> Callable[[RuleFn], RuleFn]:
    """Register a rule function under a unique name; `doc` (or its docstring) states threshold and fix."""

    def deco(fn: RuleFn) -> RuleFn:
        if name in _RULES and _RULES[name][0] is not fn:
            raise ValueError(f"rule {name!r} is registered twice")
        _RULES[name] = (fn, doc or (fn.__doc__ or "").strip())
        return fn

    return deco


def registered_rules() -> dict[str, tuple[RuleFn, str]]:
    for module in RULE_MODULES:
        importlib.import_module(module)
    return dict(_RULES)


def run_all(trace: Trace, only: list[str] | None = None) -> tuple[list[Finding], dict[str, str]]:
    """Run every registered rule (or those in `only`); a rule that raises is reported in the second
    value ({rule: error}) instead of stopping the analysis."""
    findings: list[Finding] = []
    failures: dict[str, str] = {}
    for name, (fn, _) in registered_rules().items():
        if only and name not in only:
            continue
        try:
            findings.extend(fn(trace))
        except Exception as exc:  # noqa: BLE001 - one broken rule must not hide the others
            failures[name] = f"{type(exc).__name__}: {exc}"
    order = {s: i for i, s in enumerate(reversed(SEVERITIES))}
    findings.sort(key=lambda f: (order.get(f.severity, 9), -(f.recoverable_s or 0)))
    return findings, failures
