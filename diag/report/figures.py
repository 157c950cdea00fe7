"""The report's plots from the report document: step time, each rank's steps in time, per-rank
breakdown, throughput, memory, collective bus bandwidth vs message size, loss scale over steps."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from diag.ranks import NO_RANK, rank_name
from diag.report import kept_ranks, plots
from diag.report.trace_tables import per


def _by(rows: list[dict[str, Any]], key: str, x: str, y: str, scale: float = 1.0) -> plots.Series:
    out: plots.Series = defaultdict(list)
    for r in rows:
        if r.get(x) is not None and r.get(y) is not None:
            out[rank_name(r[key]) if key == "rank" else str(r[key])].append((r[x], r[y] * scale))
    return dict(out)


def _split_bar(r: dict[str, Any]) -> dict[str, float]:
    """One rank's step split in ms per step; a step whose exposed communication is unknown (async
    collectives, no per-layer records to tell what hid them) is one bar, not a 0 ms part."""
    per = 1e6 * r["steps"]
    if r["comm_ns"] is None:
        return {"not split (no per-layer sample)": r["total_ns"] / per}
    return {
        "compute": (r["compute_ns"] or 0) / per,
        "exposed comm": r["comm_ns"] / per,
        "other": r["other_ns"] / per,
    }


def _bars(m: dict[str, Any]) -> tuple[dict[str, dict[str, float]], str]:
    """Kineto's timeline breakdown, else a diag trace's split of a step (ms per step)."""
    if m["breakdown"]:
        return (
            {
                rank_name(r["rank"]): {
                    "compute": r["compute_ns"] / 1e6,
                    "non-compute": r["non_compute_ns"] / 1e6,
                    "idle": r["idle_ns"] / 1e6,
                }
                for r in m["breakdown"]
            },
            "ms",
        )
    return (
        {rank_name(r["rank"]): _split_bar(r) for r in m.get("step_split") or [] if r["steps"]},
        "ms per step",
    )


def _memory(doc: dict[str, Any]) -> plots.Series:
    """Allocated (CUDA) or RSS (CPU) per rank over steps, in MiB."""
    out: plots.Series = defaultdict(list)
    for r in (doc.get("memory") or {}).get("timeline") or []:
        for key in ("allocated", "reserved", "rss"):
            if r.get(key) is not None and r.get("step") is not None:
                who = "log" if r["rank"] == NO_RANK else rank_name(r["rank"])
                out[f"{who} {key}"].append((r["step"], r[key] / 2**20))
    return dict(out)


STEP_COLORS = ("#4e79a7", "#a0cbe8")  # consecutive steps alternate, so their boundaries show
OVERFLOW_COLOR = "#e15759"


def _step_lanes(doc: dict[str, Any], overflow_steps: list[int]) -> str:
    """Each rank's steps on one lane, in seconds from the first: gaps, late starts and a straggler
    show as they happened; overflowed (skipped) steps in red."""
    over = set(overflow_steps)
    rows: dict[str, list[plots.Span]] = defaultdict(list)
    for r in doc.get("step_timeline") or []:
        hit = r["step"] in over or r.get("applied") is False
        color = OVERFLOW_COLOR if hit else STEP_COLORS[r["step"] % 2]
        who = rank_name(r["rank"])
        tip = f"{who} step {r['step']}: {r['dur_ms']:.1f} ms" + (" (overflow)" if hit else "")
        rows[who].append((r["start_ms"] / 1e3, r["dur_ms"] / 1e3, tip, color))
    legend = {"step (shades alternate)": STEP_COLORS[0]}
    if any(c == OVERFLOW_COLOR for v in rows.values() for *_, c in v):
        legend["overflow step"] = OVERFLOW_COLOR
    return plots.lanes(dict(rows), "Steps of each rank over time", "seconds from the first step", legend)


def figures(doc: dict[str, Any]) -> dict[str, str]:
    """title -> inline SVG."""
    m = doc["metrics"]
    bars, unit = _bars(m)
    overflow_steps = sorted({r["step"] for r in doc.get("overflows") or [] if r.get("step") is not None})
    per_step = (doc.get("throughput") or {}).get("per_step") or []
    big = max((r["tflops"] or 0 for r in per_step), default=0) >= 1
    some = kept_ranks.note((doc.get("rank_steps") or {}).get("ranks"), len(doc.get("ranks") or []))
    return {
        "Step time": plots.lines(
            _by(m["step_times"], "rank", "step", "dur_ns", 1e-6),
            "Step time" + some,
            "step",
            "ms",
            integer_x=True,
            marks=overflow_steps,
            mark_label="overflow",
        ),
        "Steps of each rank over time": _step_lanes(doc, overflow_steps),
        "Time breakdown per rank": plots.stacked_bars(bars, "Time breakdown per rank", unit),
        "Throughput per step": plots.lines(
            _by(per_step, "rank", "step", "tflops", 1.0 if big else 1e3),
            "Throughput per step" + some,
            "step",
            f"{'TFLOP/s' if big else 'GFLOP/s'} per {per(doc)}",
            integer_x=True,
            marks=overflow_steps,
            mark_label="overflow",
        ),
        "Memory over time": plots.lines(
            _memory(doc), "Memory over time" + some, "step", "MiB", integer_x=True
        ),
        "Collective bus bandwidth vs message size": plots.lines(
            _by(m["bandwidth_by_size"], "op", "bytes", "busbw"),
            "Collective bus bandwidth vs message size",
            "message size (log scale)",
            "busbw GB/s",
            logx=True,
            dots=True,
        ),
        "Loss scale": plots.lines(
            # the scale before the first step is dated one step earlier: no step -1 on the axis
            {"loss scale": [(r["step"], r["loss_scale"]) for r in m["loss_scale"] if r["step"] >= 0]},
            "Loss scale over steps",
            "step",
            "loss scale",
            integer_x=True,
            marks=overflow_steps,
            mark_label="overflow",
        ),
    }
