"""The terminal report (rich): summary, findings with their fixes, then the metric tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from diag.report.human import fix_blocks, prose
from diag.report.tables import finding_lines, summary_line, tables, throughput_lines

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def render(doc: dict[str, Any], console: Console, *, quiet: bool = False) -> None:
    """Print the report; `quiet` prints only the findings (one line each) and the summary."""
    console.print(f"[bold]diag analysis[/bold]: {summary_line(doc)}", highlight=False)
    if not quiet:
        for line in throughput_lines(doc):
            console.print(f"  {line}", highlight=False, markup=False)
    for f in doc["findings"]:
        console.print(
            f"[{_STYLE.get(f['severity'], '')}]{f['severity'].upper()}[/] {prose(f['title'])} "
            f"[dim]({f['rule']})[/dim]",
            highlight=False,
        )
        if not quiet:
            for line in finding_lines(f):
                console.print(f"    {line}", highlight=False, markup=False)
            for fix in f.get("fixes") or []:
                console.print(f"    fix: {fix['summary']}", highlight=False, markup=False)
                for label, text, _ in fix_blocks(fix):
                    console.print(f"      {label}:", highlight=False, markup=False)
                    for line in text.splitlines():
                        console.print(f"        {line}", highlight=False, markup=False, soft_wrap=True)
    if not doc["findings"] and not quiet:
        console.print("No findings.")
    if quiet:
        return
    for title, header, rows in tables(doc):
        t = Table(title=title, title_justify="left")
        for h in header:
            t.add_column(h, justify="right")
        for r in rows:
            t.add_row(*r)
        console.print(t)
    for name, err in doc["rule_failures"].items():
        console.print(f"[red]rule {name} failed:[/red] {err}", highlight=False)
