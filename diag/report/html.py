"""`--html FILE`: one self-contained HTML page (inline CSS and SVG plots, no scripts, no network)."""

from __future__ import annotations

from html import escape
from typing import Any

from diag.report.figures import figures
from diag.report.human import fix_blocks, prose
from diag.report.notes import rule_lines
from diag.report.tables import finding_lines, summary_line, tables, throughput_lines

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222}
pre{background:#f6f6f6;padding:.5em;overflow-x:auto}td:first-child{text-align:left}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right}th{background:#f3f3f3}.f{border-left:4px solid #999;padding:.2em 1em;margin:1em 0}
.critical{border-color:#c00}.warning{border-color:#e90}.info{border-color:#49c}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:12px}
.plots svg{width:100%;height:auto}small{color:#666}"""  # plots share the window's width


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<h2>{escape(title)}</h2><table><tr>{head}</tr>{body}</table>"


def _finding(f: dict[str, Any]) -> str:
    items = "".join(f"<li>{escape(line)}</li>" for line in finding_lines(f))
    for fix in f.get("fixes") or []:
        code = "".join(
            f"<div>{escape(label)}:</div><pre>{escape(text)}</pre>" for label, text, _ in fix_blocks(fix)
        )
        items += f"<li>fix: {escape(fix['summary'])}{code}</li>"
    return (
        f'<div class="f {escape(f["severity"])}"><h3>[{escape(f["severity"])}] '
        f"{escape(prose(f['title']))} <small>{escape(f['rule'])}</small></h3><ul>{items}</ul></div>"
    )


def render(doc: dict[str, Any]) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>diag analysis</title>"
        f"<style>{_CSS}</style></head><body><h1>diag analysis</h1>"
        f"<p>{escape(summary_line(doc))}</p>"
    ]
    mfu = throughput_lines(doc)
    if mfu:
        items = "".join(f"<li>{escape(x)}</li>" for x in mfu)
        parts.append(f"<h2>Throughput and MFU</h2><ul>{items}</ul>")
    parts.append("<h2>Findings</h2>")
    parts += [_finding(f) for f in doc["findings"]] or ["<p>No findings.</p>"]
    parts.append('<h2>Plots</h2><div class="plots">' + "".join(figures(doc).values()) + "</div>")
    parts += [_table(*t) for t in tables(doc)]
    problems = [p["message"] for p in doc["problems"]] + rule_lines(doc)
    if problems:
        parts.append("<h2>Problems</h2><ul>" + "".join(f"<li>{escape(p)}</li>" for p in problems) + "</ul>")
    parts.append(
        f"<p><small>schema {escape(doc['schema'])} v{doc['version']} · diag "
        f"{escape(doc['diag_version'])} · inputs: {escape(', '.join(doc['sources']))}</small></p>"
    )
    return "".join(parts) + "</body></html>\n"
