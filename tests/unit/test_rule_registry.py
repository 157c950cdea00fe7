"""The rule registry: `@rule` names the findings, refuses a name twice, and keeps the rule callable."""

from __future__ import annotations

import pytest
from diag.analyzers import base

from diag.findings import Finding, ranked
from diag.trace.model import Trace


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(base, "_RULES", {})
    monkeypatch.setattr(base, "RULE_MODULES", [])
    return base


def test_rule_fills_finding_rule(registry):
    @registry.rule("probe")
    def probe(trace, metrics):
        return [
            Finding(severity="info", title="t", detail="d"),
            Finding(rule="wrong", severity="info", title="t2", detail="d"),
        ]

    direct = probe(Trace())
    assert [f.rule for f in direct] == ["probe", "probe"]
    findings, failures = registry.run_all(Trace())
    assert [f.rule for f in findings] == ["probe", "probe"] and failures == {}
    assert registry.registered_rules()["probe"][1] == ""  # no docstring, no doc


def test_second_rule_of_a_name_is_refused(registry):
    registry.rule("dup")(lambda trace, metrics: [])
    with pytest.raises(ValueError, match="registered twice"):
        registry.rule("dup")(lambda trace, metrics: [])


def test_ranked_puts_critical_and_costly_first():
    fs = [
        Finding(severity="warning", title="a", detail="", recoverable_s=0.1),
        Finding(severity="critical", title="b", detail=""),
        Finding(severity="warning", title="c", detail="", recoverable_s=0.5),
    ]
    assert [f.title for f in ranked(fs)] == ["b", "c", "a"]
