"""The report's tables as (title, header, rows of strings), shared by the terminal, Markdown and
HTML renderers so that all three show the same figures formatted the same way."""

from __future__ import annotations

from typing import Any

from diag.units import binary_bytes as _bytes
from diag.units import ms as _ms

Table = tuple[str, list[str], list[list[str]]]


def _num(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def tables(doc: dict[str, Any]) -> list[Table]:
    m = doc["metrics"]
    out: list[Table] = []
    if m["breakdown"]:
        out.append(("Temporal breakdown", ["rank", "source", "span ms", "compute %", "non-compute %",
                                           "idle %"],
                    [[str(r["rank"]), r["source"], _ms(r["total_ns"]), _num(r["compute_pct"]),
                      _num(r["non_compute_pct"]), _num(r["idle_pct"])] for r in m["breakdown"]]))
    if m["overlap"]:
        out.append(("Communication/computation overlap", ["rank", "comm ms", "overlapped ms", "overlap %"],
                    [[str(r["rank"]), _ms(r["comm_ns"]), _ms(r["overlap_ns"]), _num(r["overlap_pct"])]
                     for r in m["overlap"]]))
    if m["collectives"]:
        out.append(("Collectives", ["rank", "op", "calls", "time ms", "mean size", "algbw GB/s",
                                    "busbw GB/s"],
                    [[str(r["rank"]), r["op"], str(r["calls"]), _ms(r["time_ns"]), _bytes(r["mean_bytes"]),
                      _num(r["algbw"], ".3f"), _num(r["busbw"], ".3f")] for r in m["collectives"]]))
    if m["stragglers"]:
        out.append(("Stragglers", ["rank", "last to arrive (share of collectives)", "median step ms",
                                   "straggler"],
                    [[str(r["rank"]), _num(r["last_arrival_frac"], ".1%"), _ms(r["median_step_ns"]),
                      "yes" if r["straggler"] else "no"] for r in m["stragglers"]]))
    return out


def finding_lines(f: dict[str, Any]) -> list[str]:
    """Detail lines under a finding's title: what, where, evidence, recoverable time, fixes."""
    lines = [f["detail"]]
    where = [f"{k}: {', '.join(map(str, f[k][:8]))}" for k in ("ranks", "layers", "steps") if f.get(k)]
    if where:
        lines.append("; ".join(where))
    if f.get("evidence"):
        lines.append("evidence: " + ", ".join(f"{k}={_short(v)}" for k, v in f["evidence"].items()))
    if f.get("recoverable_s") is not None:
        lines.append(f"recoverable: ~{f['recoverable_s'] * 1e3:.1f} ms per step")
    for fix in f.get("fixes") or []:
        parts = [fix["summary"]]
        if fix.get("ds_config"):
            parts.append(f"ds_config: {fix['ds_config']}")
        if fix.get("megatron_args"):
            parts.append("megatron: " + " ".join(fix["megatron_args"]))
        if fix.get("env"):
            parts.append("env: " + " ".join(f"{k}={v}" for k, v in fix["env"].items()))
        lines.append("fix: " + " | ".join(parts))
    return lines


def summary_line(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    st = s["steps"]
    bits = [f"{len(doc['ranks'])} rank(s)", f"{len(doc['sources'])} input(s)"]
    if st.get("count"):
        bits.append(f"{st['count']} steps, median {st['median_ms']:.1f} ms, p90 {st['p90_ms']:.1f} ms")
    if s.get("tflops_median") is not None:
        bits.append(f"{s['tflops_median']:.1f} TFLOP/s median")
    if s.get("overflows"):
        bits.append(f"{s['overflows']} overflow(s)")
    bits.append(f"{s['findings']} finding(s)")
    return " · ".join(bits)


def _short(v: object) -> object:
    """Evidence floats to 4 significant digits for reading (the JSON report keeps them exact)."""
    return f"{v:.4g}" if isinstance(v, float) else v
