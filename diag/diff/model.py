"""The diff document: everything a renderer shows, as plain JSON-able data (schema in docs/diff.md).

Bump `VERSION` when a field changes meaning or disappears; adding fields keeps the version.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import pandas as pd

from diag import __version__
from diag.diff import adapter, align, config, kineto, waterfall
from diag.diff.split import split
from diag.report.model import rows
from diag.report.records import plain

if TYPE_CHECKING:
    from diag.findings import Finding
    from diag.trace.model import Trace

SCHEMA = "diag.diff"
VERSION = 1
TOP_OPS = 50  # Kineto op rows kept in the document (the largest duration changes)


def _pct(a: float | None, b: float | None) -> float | None:
    return None if not a or b is None else 100.0 * (b - a) / a


def _ms(x: Fraction | float) -> float:
    return float(x) / 1e6


def _rate(per_step: float | None, step_ms: float | None) -> float | None:
    return per_step / step_ms * 1e3 if per_step and step_ms else None


def _side(trace: Trace, parts: pd.DataFrame) -> dict[str, Any]:
    st = adapter.step_times(trace)
    ms = st["dur_ns"].astype(float) / 1e6
    u = align.units(trace)
    med = float(ms.median()) if len(ms) else None
    return {
        "sources": list(trace.sources),
        "ranks": trace.ranks,
        "layout": trace.layout(),
        "steps": {
            "count": int(st["step"].nunique()),
            "median_ms": med,
            "p90_ms": float(ms.quantile(0.9)) if len(ms) else None,
            "mean_ms": float(ms.mean()) if len(ms) else None,
        },
        "samples_per_step": u["samples"],
        "tokens_per_step": u["tokens"],
        "throughput": {f"{k}_per_s": _rate(u[k], med) for k in ("samples", "tokens")},
        "memory": align.memory_peaks(trace),
        "estimated_steps": int((~parts["sampled"]).sum()) if len(parts) else 0,
    }


def choose_unit(a: Trace, b: Trace, want: str) -> str:
    """`auto`: per step when both runs process the same batch (or one does not say), else per
    token when both know tokens, else per sample."""
    if want != "auto":
        return want
    ua, ub = align.units(a), align.units(b)
    if ua["tokens"] and ub["tokens"] and ua["tokens"] != ub["tokens"]:
        return "token"
    if ua["samples"] and ub["samples"] and ua["samples"] != ub["samples"]:
        return "sample"
    return "step"


def _per(trace: Trace, unit: str) -> float | None:
    if unit == "step":
        return None
    n = align.units(trace)["samples" if unit == "sample" else "tokens"]
    if not n:
        from diag.errors import DiagError

        raise DiagError(f"--per {unit}: {', '.join(trace.sources)} does not record {unit}s per step")
    return n


def _per_units(a: Trace, b: Trace, pa: pd.DataFrame, pb: pd.DataFrame) -> dict[str, Any]:
    """Mean time per step, and per sample / token where both runs record them."""
    from diag.errors import DiagError

    out = {}
    for unit in waterfall.UNITS:
        try:
            sa, sb = waterfall.side(pa, _per(a, unit)), waterfall.side(pb, _per(b, unit))
        except DiagError:
            continue
        out[unit] = {
            "baseline_ms": _ms(sa.total),
            "candidate_ms": _ms(sb.total),
            "change_pct": _pct(float(sa.total), float(sb.total)),
        }
    return out


def describe(label: str) -> str:
    if label.startswith("comm:"):
        _, op, role = label.split(":", 2)
        return f"{op} ({align.ROLES.get(role, role)}), exposed"
    return {
        "compute": "compute",
        "idle": "idle / input wait",
        "optimizer": "optimizer step",
        "skipped": "overflow-skipped steps",
        "other": "other host time",
    }.get(label, label)


def exact(x: Fraction) -> str:
    """A Fraction as "n/d" (or "n"): the exact nanoseconds, so readers can check the parts' sum."""
    return str(x)


def _parts(w: waterfall.Waterfall, diffs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for lab, d in w.delta.items():
        op, role = lab.split(":", 2)[1:] if lab.startswith("comm:") else (None, None)
        keys = [
            c["key"]
            for c in diffs
            if any(lab == f or (f.endswith(":") and lab.startswith(f)) for f in c["affects"])
        ]
        out.append(
            {
                "label": lab,
                "what": describe(lab),
                "op": op,
                "role": role,
                "baseline_ms": _ms(w.baseline.parts.get(lab, 0)),
                "candidate_ms": _ms(w.candidate.parts.get(lab, 0)),
                "delta_ms": _ms(d),
                "delta_ns_exact": exact(d),
                "config": keys,
            }
        )
    return out


def _cause(parts: list[dict[str, Any]], ranks: pd.DataFrame, unit: str) -> list[str]:
    """The biggest one or two moves, with the rank that carries each when one rank dominates."""
    top = sorted(parts, key=lambda p: -abs(p["delta_ms"]))[:2]
    total = sum(abs(p["delta_ms"]) for p in parts) or 1.0
    lines = []
    for p in top:
        if abs(p["delta_ms"]) < 0.1 * total:
            continue
        line = f"{p['delta_ms']:+.2f} ms/{unit}: {p['what']}"
        if p["label"] in ranks.columns and len(ranks) > 1:
            col = ranks[p["label"]] * (1 if p["delta_ms"] > 0 else -1)
            if col.max() > 0 and col.max() >= 2 / 3 * col.clip(lower=0).sum():
                line += f", mostly rank {int(col.idxmax())}"
        lines.append(line)
    return lines


def _layers(a: Trace, b: Trace) -> list[dict[str, Any]]:
    m = align.layer_table(a).merge(
        align.layer_table(b), on=["layer", "phase"], how="outer", suffixes=("_a", "_b")
    )
    m["delta_ms"] = (m["time_ns_b"].fillna(0) - m["time_ns_a"].fillna(0)) / 1e6
    m["delta_flops"] = m["flops_b"].fillna(0) - m["flops_a"].fillna(0)
    m = m.assign(baseline_ms=m["time_ns_a"] / 1e6, candidate_ms=m["time_ns_b"] / 1e6)
    m = m.rename(columns={"flops_a": "baseline_flops", "flops_b": "candidate_flops"})
    m = m.loc[m["delta_ms"].abs().sort_values(ascending=False, kind="stable").index]
    return rows(
        m[
            [
                "layer",
                "phase",
                "baseline_ms",
                "candidate_ms",
                "delta_ms",
                "baseline_flops",
                "candidate_flops",
                "delta_flops",
            ]
        ]
    )


def _collectives(a: Trace, b: Trace) -> list[dict[str, Any]]:
    m = align.collective_table(a).merge(
        align.collective_table(b), on="key", how="outer", suffixes=("_a", "_b")
    )
    out = []
    for r in m.itertuples(index=False):
        op, role = r.key.split(":", 1)
        row = {"key": r.key, "op": op, "role": role}
        for f in ("calls", "bytes", "time_ns", "busbw"):
            va, vb = getattr(r, f"{f}_a"), getattr(r, f"{f}_b")
            row.update(
                {
                    f"baseline_{f}": va,
                    f"candidate_{f}": vb,
                    f"delta_{f}": (0 if pd.isna(vb) else vb) - (0 if pd.isna(va) else va),
                }
            )
        out.append(row)
    return sorted(out, key=lambda r: -abs(r["delta_time_ns"]))


def _findings(a: Trace, b: Trace) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    fa, fail_a = adapter.findings(a)
    fb, fail_b = adapter.findings(b)

    def short(f: Finding) -> dict[str, Any]:
        return {"rule": f.rule, "severity": f.severity, "title": f.title}

    ra, rb = {f.rule for f in fa}, {f.rule for f in fb}
    return (
        {
            "appeared": [short(f) for f in fb if f.rule not in ra],
            "resolved": [short(f) for f in fa if f.rule not in rb],
            "unchanged": [short(f) for f in fb if f.rule in ra],
        },
        {
            **{f"baseline:{k}": v for k, v in fail_a.items()},
            **{f"candidate:{k}": v for k, v in fail_b.items()},
        },
    )


def _memory(sa: dict[str, Any], sb: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k in ("peak", "rss"):
        va, vb = sa["memory"][k], sb["memory"][k]
        out[k] = {"baseline": va, "candidate": vb, "delta": None if va is None or vb is None else vb - va}
    return out


def build(a: Trace, b: Trace, unit: str = "auto") -> dict[str, Any]:
    """The diff document of baseline `a` and candidate `b`."""
    unit = choose_unit(a, b, unit)
    pa, pb = split(a), split(b)
    w = waterfall.build(pa, pb, unit, _per(a, unit), _per(b, unit))
    diffs = config.differences(a, b)
    parts = _parts(w, diffs)
    ranks = (waterfall.by_rank(pa, pb) / 1e6).rename(columns={"dur_ns": "total"})
    sa, sb = _side(a, pa), _side(b, pb)
    findings, failures = _findings(a, b)
    ops = kineto.ops_diff(a, b) if kineto.has_ops(a) or kineto.has_ops(b) else None
    return plain(
        {
            "schema": SCHEMA,
            "version": VERSION,
            "diag_version": __version__,
            "baseline": sa,
            "candidate": sb,
            "headline": {
                "median_change_pct": _pct(sa["steps"]["median_ms"], sb["steps"]["median_ms"]),
                "p90_change_pct": _pct(sa["steps"]["p90_ms"], sb["steps"]["p90_ms"]),
                "throughput_change_pct": _pct(
                    sa["throughput"]["samples_per_s"], sb["throughput"]["samples_per_s"]
                ),
                "unit": unit,
                "per_unit": _per_units(a, b, pa, pb),
                "cause": _cause(parts, ranks, unit),
            },
            "waterfall": {
                "unit": unit,
                "baseline_ms": _ms(w.baseline.total),
                "candidate_ms": _ms(w.candidate.total),
                "total_ms": _ms(w.total),
                "total_ns_exact": exact(w.total),
                "change_pct": _pct(float(w.baseline.total), float(w.candidate.total)),
                "parts": parts,
            },
            "by_rank": {str(r): {k: v for k, v in row.items()} for r, row in ranks.iterrows()},
            "layers": _layers(a, b),
            "collectives": _collectives(a, b),
            "memory": _memory(sa, sb),
            "findings": findings,
            "rule_failures": failures,
            "config": diffs,
            "ops": None
            if ops is None
            else {
                "rows": rows(ops.head(TOP_OPS)),
                "total_rows": len(ops),
                "added": int((ops["change"] == "added").sum()),
                "removed": int((ops["change"] == "removed").sum()),
            },
        }
    )
