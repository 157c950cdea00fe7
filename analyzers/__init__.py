"""Analyzer rules, one module per rule. Each is a pure function `Trace -> list[Finding]`.

Analyzers never import torch, collectors or textual, and never print or plot: renderers do that.
`run_all(trace)` imports every rule module listed in `RULES` and collects their findings.
"""

from diag.analyzers.base import Finding, Fix, registered_rules, rule, run_all

__all__ = ["Finding", "Fix", "registered_rules", "rule", "run_all"]
