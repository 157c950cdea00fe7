"""The report's four plots from the report document: step time, per-rank breakdown, collective bus
bandwidth vs message size, loss scale over steps."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from diag.report import plots


def _by(rows: list[dict[str, Any]], key: str, x: str, y: str, scale: float = 1.0) -> plots.Series:
    out: plots.Series = defaultdict(list)
    for r in rows:
        if r.get(x) is not None and r.get(y) is not None:
            out[f"{key} {r[key]}" if key == "rank" else str(r[key])].append((r[x], r[y] * scale))
    return dict(out)


def figures(doc: dict[str, Any]) -> dict[str, str]:
    """title -> inline SVG."""
    m = doc["metrics"]
    bars = {f"rank {r['rank']}": {"compute": r["compute_ns"] / 1e6, "non-compute": r["non_compute_ns"] / 1e6,
                                  "idle": r["idle_ns"] / 1e6} for r in m["breakdown"]}
    return {
        "Step time": plots.lines(_by(m["step_times"], "rank", "step", "dur_ns", 1e-6), "Step time",
                                 "step", "ms"),
        "Time breakdown per rank": plots.stacked_bars(bars, "Time breakdown per rank", "ms"),
        "Collective bus bandwidth vs message size": plots.lines(
            _by(m["bandwidth_by_size"], "op", "bytes", "busbw"),
            "Collective bus bandwidth vs message size", "message size (bytes, log)", "busbw GB/s",
            logx=True, dots=True),
        "Loss scale": plots.lines({"loss scale": [(r["step"], r["loss_scale"]) for r in m["loss_scale"]]},
                                  "Loss scale over steps", "step", "loss scale"),
    }
