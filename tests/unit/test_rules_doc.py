"""Rule thresholds are stated once in code and said the same way everywhere: every numeric threshold
constant of a rule's module appears, with its value, in the rule's docstring (what `diag analyze
--rules` and the TUI show) and in the rule's threshold cell of docs/rules.md."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest
from diag.analyzers import registered_rules

DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"


def _table() -> dict[str, list[str]]:
    """rule -> its cells in docs/rules.md's rule table (rule, detects, threshold, evidence, fixes)."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `(\w+)` \|", line)
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if m and len(cells) == 5:  # the rule table, not the scenario table below it
            rows[m.group(1)] = cells
    return rows


def thresholds(module: ModuleType) -> dict[str, float]:
    """A rule module's threshold constants: the UPPER_CASE numbers it assigns at module level (not
    what it imports)."""
    tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
    names = {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id.isupper()
    }
    return {
        k: v
        for k, v in vars(module).items()
        if k in names and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def spellings(name: str, value: float) -> list[str]:
    """How the docs write a value: by the constant's unit (its name's suffix), else as a share, a
    ratio or a count."""
    if name.endswith("_BYTES"):
        for unit in ("KiB", "MiB", "GiB"):
            value /= 1024
            if value < 1024:
                return [f"{value:g} {unit}"]
    if name.endswith("_S"):
        return [f"{value * 1e3:g} ms" if value < 1 else f"{value:g} s"]
    if name.endswith("_GBS"):
        return [f"{value:g} GB/s"]
    if isinstance(value, int):
        return [str(value)]
    if value < 1:
        return [f"{value * 100:g}%", f"{value:.2f}"]
    return [f"{value:g}x", f"{value:g}"]


def said(text: str, name: str, value: float) -> bool:
    return any(re.search(rf"(?<![\d.]){re.escape(s)}(?![\d])", text) for s in spellings(name, value))


def test_docs_table_lists_exactly_the_registered_rules():
    assert set(_table()) == set(registered_rules())


@pytest.mark.parametrize("name", sorted(registered_rules()))
def test_each_threshold_is_stated_in_docstring_and_docs(name):
    fn, doc = registered_rules()[name]
    module = importlib.import_module(fn.__module__)
    cell = _table()[name][2]
    for const, value in thresholds(module).items():
        ways = spellings(const, value)
        assert said(doc, const, value), f"{name}.{const} = {value} ({ways}) not in its docstring"
        assert said(cell, const, value), f"{name}.{const} = {value} ({ways}) not in docs/rules.md's threshold"


def test_a_changed_threshold_is_caught():
    """The check can fail: a value the docs do not state is reported, units included."""
    cell = _table()["exposed_comm"][2]
    assert said(cell, "EXPOSED_SHARE", 0.40) and not said(cell, "EXPOSED_SHARE", 0.45)
    assert spellings("TINY_BYTES", 64 * 1024) == ["64 KiB"] and spellings("MIN_GAP_S", 0.005) == ["5 ms"]
    assert not said("silent >= 600 s", "SILENT_S", 60.0)
