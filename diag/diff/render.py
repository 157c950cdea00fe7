"""Renderers of the diff document: terminal (rich), Markdown and HTML share one set of tables."""

from __future__ import annotations

import html
from typing import Any

from rich.console import Console

from diag.report.terminal import plain_table, rule_failures
from diag.units import binary_bytes

Table = tuple[str, list[str], list[list[str]]]
TOP = 15  # rows per table in the terminal and the documents (the JSON keeps more)


def _f(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _signed(v: Any, fmt: str = "+.2f") -> str:
    return "-" if v is None else format(v, fmt)


def _side_line(name: str, s: dict[str, Any]) -> str:
    st, tp = s["steps"], s["throughput"]
    bits = [f"{name}: {st['count']} steps, median {_f(st['median_ms'])} ms, p90 {_f(st['p90_ms'])} ms"]
    if tp["samples_per_s"] is not None:
        bits.append(f"{tp['samples_per_s']:.1f} samples/s")
    if tp["tokens_per_s"] is not None:
        bits.append(f"{tp['tokens_per_s']:.0f} tokens/s")
    if s["estimated_steps"]:
        bits.append(f"{s['estimated_steps']} rank-steps split by estimate (no per-layer sample)")
    return " · ".join(bits)


def headline(doc: dict[str, Any]) -> list[str]:
    h, w = doc["headline"], doc["waterfall"]
    change = [
        f"{what} {h[key]:+.1f}%"
        for what, key in (
            ("median", "median_change_pct"),
            ("p90", "p90_change_pct"),
            ("throughput", "throughput_change_pct"),
        )
        if h[key] is not None
    ]
    lines = [
        _side_line("baseline", doc["baseline"]),
        _side_line("candidate", doc["candidate"]),
        f"change: {', '.join(change)}; mean per {w['unit']} {w['baseline_ms']:.3f} -> "
        f"{w['candidate_ms']:.3f} ms ({w['total_ms']:+.3f} ms)",
    ]
    per = [
        f"per {u}: {v['baseline_ms']:.3f} -> {v['candidate_ms']:.3f} ms ({v['change_pct']:+.1f}%)"
        for u, v in h["per_unit"].items()
        if u != "step" and v["change_pct"] is not None
    ]
    if per:
        lines.append("; ".join(per))
    lines += [f"cause: {c}" for c in h["cause"]]
    return lines


def tables(doc: dict[str, Any]) -> list[Table]:
    w = doc["waterfall"]
    out: list[Table] = [
        (
            f"Where the time went (mean ms per {w['unit']}; parts sum to the total)",
            ["part", "baseline", "candidate", "change", "config that moved"],
            [
                [
                    p["what"],
                    _f(p["baseline_ms"], ".3f"),
                    _f(p["candidate_ms"], ".3f"),
                    _signed(p["delta_ms"], "+.3f"),
                    ", ".join(p["config"]) or "",
                ]
                for p in w["parts"]
            ]
            + [
                [
                    "total",
                    _f(w["baseline_ms"], ".3f"),
                    _f(w["candidate_ms"], ".3f"),
                    _signed(w["total_ms"], "+.3f"),
                    "",
                ]
            ],
        )
    ]
    if len(doc["by_rank"]) > 1:
        top = [p for p in sorted(w["parts"], key=lambda p: -abs(p["delta_ms"])) if p["delta_ms"]][:5]
        out.append(
            (
                "By rank (change, mean ms per step)",
                ["rank", *[p["what"] for p in top], "total"],
                [
                    [r, *[_signed(v.get(p["label"]), "+.3f") for p in top], _signed(v["total"], "+.3f")]
                    for r, v in doc["by_rank"].items()
                ],
            )
        )
    if doc["config"]:
        out.append(
            (
                "Config differences",
                ["setting", "baseline", "candidate"],
                [[c["key"], str(c["baseline"]), str(c["candidate"])] for c in doc["config"]],
            )
        )
    if doc["collectives"]:
        out.append(
            (
                "Collectives (per step and rank)",
                ["op", "role", "calls", "bytes", "call ms", "busbw GB/s"],
                [
                    [
                        c["op"],
                        c["role"],
                        _pair(c, "calls", ".1f"),
                        _pair(c, "bytes", None),
                        _pair(c, "time_ns", "ms"),
                        _pair(c, "busbw", ".4f"),
                    ]
                    for c in doc["collectives"][:TOP]
                ],
            )
        )
    if doc["layers"]:
        out.append(
            (
                "Layers by time at stake (ms per sampled step)",
                ["layer", "phase", "baseline", "candidate", "change", "FLOPs change"],
                [
                    [
                        r["layer"],
                        r["phase"],
                        _f(r["baseline_ms"], ".3f"),
                        _f(r["candidate_ms"], ".3f"),
                        _signed(r["delta_ms"], "+.3f"),
                        _signed(r["delta_flops"], "+,.0f"),
                    ]
                    for r in doc["layers"][:TOP]
                ],
            )
        )
    mem = [
        [k, _b(v["baseline"]), _b(v["candidate"]), _b(v["delta"], signed=True)]
        for k, v in doc["memory"].items()
        if v["baseline"] is not None or v["candidate"] is not None
    ]
    if mem:
        out.append(("Memory peaks", ["what", "baseline", "candidate", "change"], mem))
    f = doc["findings"]
    frows = [
        [state, x["rule"], x["severity"], x["title"]]
        for state in ("appeared", "resolved", "unchanged")
        for x in f[state]
    ]
    if frows:
        out.append(("Findings", ["state", "rule", "severity", "title"], frows))
    if doc["ops"]:
        o = doc["ops"]
        out.append(
            (
                f"Kineto ops/kernels ({o['added']} added, {o['removed']} removed of {o['total_rows']})",
                ["device", "name", "count", "total ms", "change"],
                [
                    [
                        r["device"],
                        r["name"][:60],
                        f"{r['count_a']} -> {r['count_b']}",
                        f"{r['dur_ns_a'] / 1e6:.3f} -> {r['dur_ns_b'] / 1e6:.3f}",
                        r["change"],
                    ]
                    for r in o["rows"][:TOP]
                ],
            )
        )
    return out


def _b(v: Any, signed: bool = False) -> str:
    if v is None:
        return "-"
    return ("+" if signed and v > 0 else "-" if v < 0 else "") + binary_bytes(abs(v))


def _pair(c: dict[str, Any], f: str, fmt: str | None) -> str:
    def one(v: Any) -> str:
        if v is None:
            return "-"
        if fmt is None:
            return binary_bytes(v)
        return f"{v / 1e6:.3f}" if fmt == "ms" else format(v, fmt)

    return f"{one(c[f'baseline_{f}'])} -> {one(c[f'candidate_{f}'])}"


def terminal(doc: dict[str, Any], console: Console) -> None:
    console.print("[bold]diag diff[/bold]", highlight=False)
    for line in headline(doc):
        console.print(f"  {line}", highlight=False, markup=False)
    for title, header, rows in tables(doc):
        console.print(plain_table(title, header, rows, left=("part", "layer", "name", "title", "setting")))
    rule_failures(doc, console)


def markdown(doc: dict[str, Any]) -> str:
    out = ["# diag diff", "", *[f"- {line}" for line in headline(doc)], ""]
    for title, header, rows in tables(doc):
        out += [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        out.append("")
    return "\n".join(out)


def to_html(doc: dict[str, Any]) -> str:
    esc = html.escape
    body = ["<h1>diag diff</h1><ul>", *[f"<li>{esc(line)}</li>" for line in headline(doc)], "</ul>"]
    for title, header, rows in tables(doc):
        body.append(
            f"<h2>{esc(title)}</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
        )
        body += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows]
        body.append("</table>")
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>diag diff</title><style>{style}"
        f"</style></head><body>{''.join(body)}</body></html>\n"
    )
