"""Tables of a diag trace's own signals (step split, top layers, steps, memory, overflows) as
(title, header, rows of strings), like diag/report/tables.py, in human units."""

from __future__ import annotations

from typing import Any

from diag.ranks import rank_label
from diag.units import binary_bytes, flop_count, flop_rate, percent, rate

Table = tuple[str, list[str], list[list[str]]]
MAX_STEP_ROWS = 40


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def split_table(doc: dict[str, Any]) -> list[Table]:
    rows = doc["metrics"].get("step_split") or []
    if not rows:
        return []
    basis = ", ".join(sorted({r["basis"] for r in rows}))
    if any(r["comm_pct"] is None for r in rows):
        basis += (
            "; exposed comm -: async collectives ran and no steady step has per-layer records to "
            "tell how much compute hid them"
        )
    # the tensor-parallel groups' part of the exposed time, where any: blocking by design
    tp = any(r.get("tp_ns") for r in rows)
    return [
        (
            f"Step time per rank: compute / exposed communication / other ({basis})",
            ["rank", "steps", "step ms (mean)", "compute %", "exposed comm %"]
            + (["of which TP %"] if tp else [])
            + ["other %"],
            [
                [
                    rank_label(r["rank"]),
                    str(r["steps"]),
                    _ms(r["total_ns"] / 1e6 / max(r["steps"], 1)),
                    _pct(r["compute_pct"]),
                    _pct(r["comm_pct"]),
                ]
                + ([_pct(r.get("tp_pct"))] if tp else [])
                + [_pct(r["other_pct"])]
                for r in rows
            ],
        )
    ]


def layers_table(doc: dict[str, Any]) -> list[Table]:
    rows = doc.get("layers") or []
    if not rows:
        return []
    with_mem = any(r.get("mem_delta") is not None for r in rows)
    head = ["module", "fwd ms", "bwd ms", "FLOPs", "FLOP/s", "MFU"] + (["fwd mem delta"] if with_mem else [])
    body = [
        [
            r["module"],
            _ms(r["fwd_ms"]),
            _ms(r["bwd_ms"]),
            flop_count(r["flops"]) if r["flops"] else "-",
            flop_rate(r["tflops"]),
            percent(r["mfu"]),
        ]
        + ([binary_bytes(r["mem_delta"])] if with_mem else [])
        for r in rows
    ]
    devices = {r["device"] for r in (doc.get("memory") or {}).get("peaks") or []}
    note = "; memory deltas: none on CPU (no device allocator)" if not with_mem and devices == {"cpu"} else ""
    title = f"Top layers by time (leaf modules, each on its lowest rank, {_samples(rows)}{note})"
    return [(title, head, body)]


def _samples(rows: list[dict[str, Any]]) -> str:
    """Which steps the layers' times are from: warm-up samples are said as such."""
    warm = sum(bool(r.get("warmup")) for r in rows)
    if warm == len(rows):
        return "warm-up steps only"
    steps = max(int(r["steps"]) for r in rows if not r.get("warmup"))
    said = f"mean of {steps} steady sampled step{'s' if steps != 1 else ''}"
    return said + (f"; {warm} of warm-up steps only" if warm else "")


STEP_COLUMNS = ("step", "slowest ms", "fastest ms", "slowest rank", "applied")


def per(doc: dict[str, Any]) -> str:
    """ "GPU", or "rank" where the ranks ran on CPUs (`throughput.per`)."""
    return str((doc.get("throughput") or {}).get("per") or "GPU")


def steps_table(doc: dict[str, Any]) -> list[Table]:
    rows = doc.get("steps") or []
    if not rows:
        return []
    title = "Steps"
    if len(rows) > MAX_STEP_ROWS:
        rows = sorted(sorted(rows, key=lambda r: -r["max_ms"])[: MAX_STEP_ROWS // 2], key=lambda r: r["step"])
        title = f"Steps (the {len(rows)} slowest of {len(doc['steps'])})"
    return [
        (
            title,
            [*STEP_COLUMNS, f"FLOP/s per {per(doc)}", "samples/s"],
            [
                [
                    str(r["step"]),
                    _ms(r["max_ms"]),
                    _ms(r["min_ms"]),
                    rank_label(r["slowest_rank"]),
                    "-" if r["applied"] is None else "yes" if r["applied"] else "skipped",
                    flop_rate(r["tflops"]) + (" (sampled)" if r["sampled"] else ""),
                    "-" if r["samples_per_s"] is None else rate(r["samples_per_s"], "samples"),
                ]
                for r in rows
            ],
        )
    ]


def memory_table(doc: dict[str, Any]) -> list[Table]:
    rows = (doc.get("memory") or {}).get("peaks") or []
    if not rows:
        return []
    return [
        (
            "Memory per rank",
            ["rank", "device", "peak allocated", "peak reserved", "capacity", "peak / capacity", "peak RSS"],
            [
                [
                    rank_label(r["rank"]),
                    r["device"],
                    binary_bytes(r["peak_allocated"]),
                    binary_bytes(r["peak_reserved"]),
                    binary_bytes(r["capacity"]),
                    percent(r["peak_share"]),
                    binary_bytes(r["peak_rss"]),
                ]
                for r in rows
            ],
        )
    ]


def overflow_table(doc: dict[str, Any]) -> list[Table]:
    rows = doc.get("overflows") or []
    if not rows:
        return []
    return [
        (
            "fp16 overflows (steps skipped)",
            ["rank", "step", "loss scale", "source"],
            [
                [
                    rank_label(r["rank"]),
                    str(r["step"]),
                    f"{_g(r.get('scale_before'))} -> {_g(r.get('scale_after'))}",
                    str(r.get("source") or "-"),
                ]
                for r in rows
            ],
        )
    ]


def _g(v: Any) -> str:
    return "?" if v is None else f"{v:g}"


def trace_tables(doc: dict[str, Any]) -> list[Table]:
    return [
        *split_table(doc),
        *layers_table(doc),
        *steps_table(doc),
        *memory_table(doc),
        *overflow_table(doc),
    ]
