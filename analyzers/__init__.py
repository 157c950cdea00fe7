"""Analyzer rules, one module per rule. Each is a pure function `Trace -> list[Finding]`.

Analyzers never import torch, collectors or textual, and never print or plot: renderers do that.
`run_all(trace)` imports every rule module listed in `RULES` and collects their findings.
"""

from diag.analyzers.base import registered_rules, rule, run_all

from diag.findings import Finding, Fix  # re-exported: the types live in the core

__all__ = ["Finding", "Fix", "registered_rules", "rule", "run_all"]
