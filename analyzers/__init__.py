"""Analyzer rules, one module per rule. Each is a pure function `(Trace, Metrics) -> list[Finding]`.

Analyzers never import torch, collectors or textual, nor the report, the TUI or the CLI, and never
print or plot: renderers do that (contracts in pyproject.toml, checked by tests/unit/test_layering.py).
`run_all(trace)` imports every rule module listed in `base.RULE_MODULES` and collects their findings.
Shared helpers: `config` (the job's DeepSpeed settings), `evidence` (plain values for findings).
"""

from diag.analyzers.base import registered_rules, rule, run_all

from diag.findings import Finding, Fix  # re-exported: the types live in the core

__all__ = ["Finding", "Fix", "registered_rules", "rule", "run_all"]
