"""The rule registry.

A rule module decorates one function with `@rule("name")`; the registry refuses a second rule of the
same name and stamps every finding the function returns with that name. Rule modules are listed in
`RULE_MODULES` and imported by `run_all`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from diag.findings import Finding, ranked

if TYPE_CHECKING:
    from diag.trace.model import Trace

# Every rule module, in report order. A rule module that fails to import is reported, not fatal.
RULE_MODULES: list[str] = [
    "diag.analyzers.hang_desync", "diag.analyzers.zero3_slow_link", "diag.analyzers.tp_cross_node",
    "diag.analyzers.overflow_storm", "diag.analyzers.memory_pressure", "diag.analyzers.embedding_comm",
    "diag.analyzers.straggler", "diag.analyzers.exposed_comm", "diag.analyzers.pipeline_bubble",
    "diag.analyzers.tiny_collectives", "diag.analyzers.idle_between_steps",
]

RuleFn = Callable[["Trace"], list[Finding]]
_RULES: dict[str, tuple[RuleFn, str]] = {}


def rule(name: str, doc: str = "") -> Callable[[RuleFn], RuleFn]:
    """Register a rule function under a unique name; `doc` (or its docstring) states threshold and fix.
    The registered function fills `Finding.rule` of what it returns."""

    def deco(fn: RuleFn) -> RuleFn:
        if name in _RULES and getattr(_RULES[name][0], "__wrapped__", None) is not fn:
            raise ValueError(f"rule {name!r} is registered twice")

        @functools.wraps(fn)
        def named(trace: Trace) -> list[Finding]:
            found = fn(trace)
            for f in found:
                f.rule = name
            return found

        _RULES[name] = (named, doc or (fn.__doc__ or "").strip())
        return named

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
    return ranked(findings), failures
