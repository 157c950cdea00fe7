"""Facts read back from a generated sample trace, for its README (so the README cannot drift)."""

from __future__ import annotations

import glob
import os

from diag import load


def measured_lines(folder: str) -> list[str]:
    trace = load(folder)
    steps = trace.steps
    lines = [f"- ranks: {trace.ranks}; layout: {_layout(trace)}",
             f"- steps per rank: {steps.groupby('rank').size().to_dict()}; skipped (applied=false) "
             f"per rank: {(steps['applied'] == False).groupby(steps['rank']).sum().to_dict()}"]  # noqa: E712
    comms = trace.comms[trace.comms["rank"] == 0]
    if not comms.empty:
        by = comms.groupby(comms["op"].astype(str)).agg(n=("bytes", "size"), b=("bytes", "sum"))
        lines.append("- rank 0 collectives: " + ", ".join(
            f"{op} x{int(r.n)} ({int(r.b)} B)" for op, r in by.iterrows()))
    ov = trace.overflow
    hits = ov[(ov["rank"] == 0) & (ov["overflow"] == True)]  # noqa: E712
    if not hits.empty:
        lines.append("- rank 0 overflows: " + ", ".join(
            f"step {int(r.step)} ({r.scale_before:g}->{r.scale_after:g})" for r in hits.itertuples()))
    layers = trace.layers
    lines.append(f"- layer records: {len(layers)} on steps {sorted(set(layers['step']))}")
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*.jsonl")))
    lines.append(f"- trace size: {size / 1024:.0f} KiB; collector errors: {len(trace.errors)}")
    return lines


def _layout(trace: object) -> str:
    lay = trace.layout()  # type: ignore[attr-defined]
    return ", ".join(f"{k}={lay[k]}" for k in ("world_size", "tp", "dp", "zero_stage", "dtype")
                     if k in lay)


def analyze_rules(folder: str) -> list[str]:
    """Rule names `diag analyze` reports on the trace ([] when the analyzers are not installed)."""
    try:
        from diag.analyzers.base import run_all
    except ImportError:
        return []
    findings, _ = run_all(load(folder))
    return sorted({f.rule for f in findings})
