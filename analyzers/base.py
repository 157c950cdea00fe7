"""The rule registry.

A rule is a pure function `(Trace, Metrics) -> list[Finding]`: it reads the figures of the analysis
stage (`diag.metrics.stage.Metrics`, computed once per trace and shared with the report) and the
trace's headers, never another rule. A rule module decorates it with `@rule("name")`; the registry
refuses a second rule of the same name and stamps every finding the function returns with that
name, and drops any fix naming a knob the job's framework lacks at its detected version
(`framework.Job.applicable`): one check for every rule. Rule modules are listed in `RULE_MODULES` and
imported by `run_all`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from diag.analyzers import framework

from diag.findings import Finding, ranked
from diag.metrics.stage import Metrics
from diag.metrics.withheld import WholeOnly
from diag.trace.heap import release_memory

if TYPE_CHECKING:
    from diag.trace.model import Trace

# Every rule module, in report order. A rule module that fails to import is reported, not fatal.
RULE_MODULES: list[str] = [
    "diag.analyzers.hang_desync",
    "diag.analyzers.zero3_slow_link",
    "diag.analyzers.tp_cross_node",
    "diag.analyzers.overflow_storm",
    "diag.analyzers.memory_pressure",
    "diag.analyzers.memory_growth",
    "diag.analyzers.embedding_comm",
    "diag.analyzers.straggler",
    "diag.analyzers.exposed_comm",
    "diag.analyzers.pipeline_bubble",
    "diag.analyzers.tiny_collectives",
    "diag.analyzers.idle_between_steps",
    "diag.analyzers.launch_bound",
    "diag.analyzers.job_crash",
    "diag.analyzers.loss_spike",
    "diag.analyzers.loss_climb",
    "diag.analyzers.nan_loss",
    "diag.analyzers.throughput_drop",
    "diag.analyzers.collective_desync",
    "diag.analyzers.collective_mismatch",
]

RuleFn = Callable[["Trace", Metrics], list[Finding]]


class Rule(Protocol):
    """A registered rule: callable with the stage's metrics, or alone (it then computes them)."""

    def __call__(self, trace: Trace, metrics: Metrics | None = None) -> list[Finding]: ...


_RULES: dict[str, tuple[Rule, str]] = {}


def rule(name: str, doc: str = "") -> Callable[[RuleFn], Rule]:
    """Register a rule function under a unique name; `doc` (or its docstring) states threshold and fix.
    The registered function fills `Finding.rule` of what it returns."""

    def deco(fn: RuleFn) -> Rule:
        if name in _RULES and getattr(_RULES[name][0], "__wrapped__", None) is not fn:
            raise ValueError(f"rule {name!r} is registered twice")

        @functools.wraps(fn)
        def named(trace: Trace, metrics: Metrics | None = None) -> list[Finding]:
            metrics = metrics if metrics is not None else Metrics(trace)
            found = fn(trace, metrics)
            for f in found:
                f.rule = name
                if f.fixes:
                    job = framework.job_of(metrics)
                    f.fixes = [x for x in f.fixes if job.applicable(x)]
            return found

        _RULES[name] = (named, doc or (fn.__doc__ or "").strip())
        return named

    return deco


def registered_rules() -> dict[str, tuple[Rule, str]]:
    for module in RULE_MODULES:
        importlib.import_module(module)
    return dict(_RULES)


def run_all(
    trace: Trace, only: list[str] | None = None, metrics: Metrics | None = None
) -> tuple[list[Finding], dict[str, str]]:
    """Run every registered rule (or those in `only`) on one `Metrics` of the trace (pass the one the
    report reads, or one is made); a rule that raises is reported in the second value ({rule: error})
    instead of stopping the analysis."""
    metrics = metrics if metrics is not None else Metrics(trace)
    findings: list[Finding] = []
    failures: dict[str, str] = {}
    for name, (fn, _) in registered_rules().items():
        if only and name not in only:
            continue
        try:
            findings.extend(fn(trace, metrics))
        except WholeOnly as exc:  # (the windowed pass: a rule that reads every call, not reduced)
            failures[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - one broken rule must not hide the others
            failures[name] = f"{type(exc).__name__}: {exc}"
        metrics.end_rule()
        # the rule's temporaries are freed, but glibc kept their pages: the next rule's arrays went
        # above them (16 ranks x 1,000 steps: the rules' peak 312 MiB RSS with them kept, 268 without)
        release_memory()
    return ranked(findings), failures
