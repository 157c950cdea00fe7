"""`--markdown FILE`: the report as GitHub-flavoured Markdown (no plots; the HTML report has them)."""

from __future__ import annotations

from typing import Any

from diag.report.human import fix_blocks, prose
from diag.report.notes import rule_lines
from diag.report.tables import finding_lines, summary_line, tables, throughput_lines


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render(doc: dict[str, Any]) -> str:
    out = ["# diag analysis", "", summary_line(doc), ""]
    mfu = throughput_lines(doc)
    if mfu:
        out += ["## Throughput and MFU", ""] + [f"- {_cell(line)}" for line in mfu] + [""]
    out += ["## Findings", ""]
    if not doc["findings"]:
        out += ["No findings.", ""]
    for f in doc["findings"]:
        out.append(f"### [{f['severity']}] {prose(f['title'])} (`{f['rule']}`)")
        out += [""] + [f"- {_cell(line)}" for line in finding_lines(f)]
        for fix in f.get("fixes") or []:
            out.append(f"- fix: {_cell(fix['summary'])}")
            for label, text, lang in fix_blocks(fix):
                out += ["", f"  {label}:", "", f"  ```{lang}"] + [f"  {line}" for line in text.splitlines()]
                out += ["  ```", ""]
        out.append("")
    for title, header, rows in tables(doc):
        out += [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
        out.append("")
    notes = rule_lines(doc, lambda k: f"`{k}`", _cell)
    if doc["problems"] or notes:
        out += ["## Problems", ""]
        out += [f"- {_cell(p['message'])}" for p in doc["problems"]]
        out += [f"- {line}" for line in notes]
        out.append("")
    out.append(
        f"_schema {doc['schema']} v{doc['version']}, diag {doc['diag_version']}; inputs: "
        + ", ".join(f"`{s}`" for s in doc["sources"])
        + "_"
    )
    return "\n".join(out) + "\n"
