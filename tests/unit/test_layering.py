"""The layering contracts of pyproject.toml (`[tool.importlinter]`), checked with `lint-imports` over
the tree laid out as a wheel installs it (scripts/lint_imports.py, which `make lint` runs: in a
checkout `diag.collectors` and `diag.analyzers` live beside `diag/`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("importlinter", reason="import-linter is in the dev extra; not installed here")
_spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts" / "lint_imports.py")
assert _spec is not None and _spec.loader is not None
_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_script)
_installed_layout, _lint = _script.installed_layout, _script.lint


def test_layering_contracts_are_kept(tmp_path):
    out = _lint(_installed_layout(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout and "Contracts: 11 kept" in out.stdout, out.stdout


def test_a_report_importing_a_rule_breaks_a_contract(tmp_path):
    """The check can fail: the report layer reaching back into the analyzers is caught, through an
    intermediate module too."""
    tree = _installed_layout(tmp_path)
    (tree / "diag" / "report" / "leak.py").write_text("from diag.units import ms\nimport diag.tui.fmt\n")
    (tree / "diag" / "units_leak.py").write_text("from diag.analyzers import run_all\n")
    (tree / "diag" / "report" / "leak2.py").write_text("import diag.units_leak\n")
    out = _lint(tree)
    assert out.returncode != 0
    assert "the report renders documents: no analyzers, UI or CLI BROKEN" in out.stdout, out.stdout
    assert "diag.report.leak2 -> diag.units_leak" in out.stdout and "diag.tui" in out.stdout


def test_the_import_cycles_that_were_broken_stay_broken(tmp_path):
    """Issue 15: an injector importing `diag.inject` (InjectFailed lived there, and it imports the
    injectors) and the control server importing `diag.agent` (which starts it) are each caught."""
    tree = _installed_layout(tmp_path)
    gdb = tree / "diag" / "inject" / "gdb.py"
    gdb.write_text(
        gdb.read_text().replace(
            "from diag.inject.failure import InjectFailed", "from diag.inject import InjectFailed"
        )
    )
    server = tree / "diag" / "control" / "server.py"
    server.write_text(
        server.read_text() + "\n\ndef _current():\n    from diag import agent\n\n    return agent.current()\n"
    )
    out = _lint(tree)
    assert out.returncode != 0
    assert "diag.inject.gdb -> diag.inject (l." in out.stdout, out.stdout
    assert "diag.control.server -> diag.agent (l." in out.stdout, out.stdout
    assert "No cycles are allowed in diag." in out.stdout, out.stdout
