"""The terminal report (rich): summary, findings with their fixes, then the metric tables.

Every text that comes from the job (an exception's message, a module's name, a rule's error) is
escaped or printed as plain `Text`: rich reads `[...]` as markup, and gloo's "[/__w/pytorch/.../
pair.cc:537] Read error" in a crash finding's title stopped `diag analyze` with a MarkupError.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from diag.report.human import fix_blocks, prose
from diag.report.tables import finding_lines, summary_line, tables, throughput_lines

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_RANK_COLUMNS = ("rank",)
_NAME_COLUMNS = ("op", "op [group]")  # what a cell names, never cut
_FOLD_COLUMNS = ("module",)  # long qualified names: folded over lines, never cut


def render(doc: dict[str, Any], console: Console, *, quiet: bool = False) -> None:
    """Print the report; `quiet` prints only the findings (one line each) and the summary."""
    console.print(f"[bold]diag analysis[/bold]: {escape(summary_line(doc))}", highlight=False)
    if not quiet:
        for line in throughput_lines(doc):
            console.print(f"  {line}", highlight=False, markup=False)
    for f in doc["findings"]:
        console.print(
            f"[{_STYLE.get(f['severity'], '')}]{f['severity'].upper()}[/] {escape(prose(f['title']))} "
            f"[dim]({escape(f['rule'])})[/dim]",
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
        console.print(plain_table(title, header, rows))
    rule_failures(doc, console)


def plain_table(
    title: str, header: Sequence[str], rows: Iterable[Sequence[str]], left: Iterable[str] = ()
) -> Table:
    """A rich table whose title and cells are plain text (never markup); numbers right-justified,
    names (`left`, `_NAME_COLUMNS`, `_FOLD_COLUMNS`) left-justified, as a name reads from its
    start. A rank column is never wrapped (`pid 20267` on one line); a name
    column (`_NAME_COLUMNS`) is as wide as its longest word (`all_reduce` read `all_red…` at 80
    columns: the numbers wrap instead); a module column (`_FOLD_COLUMNS`) folds a long name over
    lines (cut, megatron-core's `module.decoder.layers.1.self_attention.linear_proj` and every other
    leaf of that layer read `module.decoder.layers.1…` at 80 columns)."""
    lefts = set(left)
    rows = [list(r) for r in rows]
    t = Table(title=Text(title), title_justify="left")
    for i, h in enumerate(header):
        words = (w for r in rows for w in r[i].split()) if h in _NAME_COLUMNS else ()
        widest = max((len(w) for w in words), default=None)
        t.add_column(
            Text(h),
            justify="left" if h in lefts or h in _NAME_COLUMNS or h in _FOLD_COLUMNS else "right",
            no_wrap=h in _RANK_COLUMNS,
            min_width=widest,
            overflow="fold" if h in _FOLD_COLUMNS else "ellipsis",
        )
    for r in rows:
        t.add_row(*(Text(c) for c in r))
    return t


def rule_failures(doc: dict[str, Any], console: Console) -> None:
    from diag.report.notes import rule_lines

    for line in rule_lines(doc):
        console.print(f"[red]{escape(line)}[/red]", highlight=False)
