"""Live findings of the analyzers: a table of findings and the selected one's detail and fixes."""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from diag.ranks import rank_list
from diag.report.human import evidence_line
from diag.tui.widgets.table import SyncTable

COLUMNS = ("#", "severity", "rule", "finding", "ranks", "recoverable ms/step")


def finding_cells(i: int, f: Any) -> tuple[str, ...]:
    ranks = rank_list(f.ranks)
    rec = f"{f.recoverable_s * 1e3:.1f}" if f.recoverable_s is not None else "-"
    return (str(i), f.severity, f.rule, f.title, ranks, rec)


def describe(f: Any) -> str:
    """The detail and every suggested fix of one finding, as plain text."""
    lines = [f"[{f.severity}] {f.title}", f.detail]
    if f.evidence:
        lines.append("evidence: " + evidence_line(dict(list(f.evidence.items())[:8])))
    for fix in f.fixes or []:
        lines.append(f"fix: {fix.summary}")
        if fix.ds_config:
            lines.append(f"  ds_config: {json.dumps(fix.ds_config)}")
        if fix.megatron_args:
            lines.append(f"  megatron: {' '.join(fix.megatron_args)}")
        if fix.env:
            lines.append("  env: " + " ".join(f"{k}={v}" for k, v in fix.env.items()))
    return "\n".join(lines)


class FindingsPanel(Vertical):
    """Findings table above the selected finding's detail."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.findings: list[Any] = []
        self.note = "analyzers not run yet"

    def compose(self) -> ComposeResult:
        yield SyncTable(COLUMNS, id="findings-table")
        yield Static(Text(self.note), id="finding-detail")

    def show(self, findings: list[Any], failures: dict[str, str], error: str | None) -> None:
        self.findings = findings
        table = self.query_one(SyncTable)
        table.sync({str(i): finding_cells(i, f) for i, f in enumerate(findings)}, order=int)
        if error:
            self.note = f"analyzers failed: {error}"
        elif not findings:
            self.note = "no findings" + (
                f" ({len(failures)} rule(s) failed: {', '.join(sorted(failures))})" if failures else ""
            )
        else:
            self.note = describe(findings[0]) if table.cursor_row == 0 else self.note
        self.query_one("#finding-detail", Static).update(Text(self.note))

    def on_data_table_row_highlighted(self, event: SyncTable.RowHighlighted) -> None:
        key = event.row_key.value
        if key is not None and key.isdigit() and int(key) < len(self.findings):
            self.note = describe(self.findings[int(key)])
            self.query_one("#finding-detail", Static).update(Text(self.note))
