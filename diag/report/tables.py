"""The report's tables as (title, header, rows of strings), shared by the terminal, Markdown and
HTML renderers so that all three show the same figures formatted the same way."""

from __future__ import annotations

from typing import Any

from diag.ranks import rank_count, rank_label, rank_list
from diag.report.human import evidence_line, prose
from diag.report.many_ranks import Table, condensed
from diag.report.trace_tables import per, trace_tables
from diag.units import binary_bytes as _bytes
from diag.units import flop_count, flop_rate, percent, rate, significant
from diag.units import ms as _ms
from diag.vocab import UNNAMED_GROUP


def _num(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def throughput_table(doc: dict[str, Any]) -> list[Table]:
    tp = doc.get("throughput") or {}
    rows = [
        r
        for r in tp.get("per_rank") or []
        if r.get("flops_per_step") is not None or r.get("samples_per_s") is not None
    ]
    if not rows:
        return []
    title = "Throughput per rank (steady steps without FLOP counting, medians"
    job = tp.get("measured") or {}
    if job.get("samples_per_s") is not None:
        dp = tp.get("dp")
        share = f"1/{dp} of" if dp else "per rank unknown (no DP size recorded);"
        title += f"; samples/s and tokens/s: the rank's data-parallel replica's, {share} the job's "
        title += _rate(job["samples_per_s"], "samples")
        if job.get("tokens_per_s") is not None:
            title += ", " + _rate(job["tokens_per_s"], "tokens")
    return [
        (
            title + ")",
            ["rank", "steps", "FLOPs/step", "step ms", "FLOP/s", "MFU", "samples/s", "tokens/s"],
            [
                [
                    rank_label(r["rank"]),
                    str(r["steps"]),
                    flop_count(r["flops_per_step"]),
                    _num(r["step_ms"]),
                    flop_rate(r["tflops"]),
                    percent(r["mfu"]),
                    _rate(r["samples_per_s"], "samples"),
                    _rate(r["tokens_per_s"], "tokens"),
                ]
                for r in rows
            ],
        )
    ]


def _gbs(v: Any) -> str:
    """A bandwidth given in GB/s, in the unit that reads best (26.1 KB/s, 12.3 GB/s)."""
    return "-" if v is None else significant(v * 1e9, ("B/s", "KB/s", "MB/s", "GB/s", "TB/s"))


def _rate(v: Any, unit: str) -> str:
    return "-" if v is None else rate(v, unit)


def throughput_lines(doc: dict[str, Any]) -> list[str]:
    """The MFU paragraph: measured and model views side by side, the job's own figure, the peak."""
    tp = doc.get("throughput") or {}
    meas, model, peak = tp.get("measured") or {}, tp.get("model"), tp.get("peak")
    out = []
    if meas.get("tflops_per_gpu") is not None:
        util = f"MFU {percent(meas['mfu'])}" if meas.get("mfu") is not None else "MFU unknown"
        out.append(f"measured: {flop_rate(meas['tflops_per_gpu'])} per {per(doc)} (mean over ranks), {util}")
    if model:
        line = (
            f"model ({model['formula']} formula, batch {model['batch']}, world {model['world_size']}): "
            f"{flop_count(model['flops_per_iteration'])} per iteration"
        )
        if model.get("tflops_per_gpu") is not None:
            line += (
                f", {flop_rate(model['tflops_per_gpu'])} per {per(doc)} at "
                f"{model['step_s'] * 1e3:.1f} ms per iteration"
            )
            if model.get("mfu") is not None:
                line += f", MFU {percent(model['mfu'])}"
        if model.get("tflops_on_log_times") is not None:
            line += f"; on the log's own iteration times {flop_rate(model['tflops_on_log_times'])}"
        out.append(line)
    if tp.get("log_tflops_median") is not None:
        out.append(
            f"the job's log prints {tp['log_tflops_median']:.2f} TFLOP/s per GPU (median of its TFLOPs lines)"
        )
    if not out:
        return []
    if peak:
        out.append(
            f"peak: {peak['tflops']:g} TFLOP/s dense {peak['dtype']} on {peak['device']} ({peak['source']})"
        )
    elif tp.get("peak_note"):
        out.append(f"peak: {tp['peak_note']}")
    if tp.get("counted"):
        out.append(f"counted: {tp['counted']}")
    return out


def tables(doc: dict[str, Any]) -> list[Table]:
    """Every table the human renderers show; a per-rank one of a big job by its notable ranks."""
    m = doc["metrics"]
    out: list[Table] = [*throughput_table(doc), *trace_tables(doc)]
    if m["breakdown"]:
        out.append(
            (
                "Temporal breakdown",
                ["rank", "source", "span ms", "compute %", "non-compute %", "idle %"],
                [
                    [
                        rank_label(r["rank"]),
                        r["source"],
                        _ms(r["total_ns"]),
                        _num(r["compute_pct"]),
                        _num(r["non_compute_pct"]),
                        _num(r["idle_pct"]),
                    ]
                    for r in m["breakdown"]
                ],
            )
        )
    if m["overlap"]:
        out.append(
            (
                "Communication/computation overlap",
                ["rank", "comm ms", "overlapped ms", "overlap %"],
                [
                    [rank_label(r["rank"]), _ms(r["comm_ns"]), _ms(r["overlap_ns"]), _num(r["overlap_pct"])]
                    for r in m["overlap"]
                ],
            )
        )
    if m["collectives"]:
        # each op beside its group where the table holds several; one named group is said once, in
        # the title (a group per row wrapped every row at 80 columns)
        groups = {r.get("group") for r in m["collectives"]}
        several = len(groups) > 1
        (one,) = groups if not several else (None,)
        where = f" in group {one}" if one and one != UNNAMED_GROUP else ""
        out.append(
            (
                f"Collectives{where} (time: each call's start to its end on that rank, waiting for the "
                "other ranks included; algbw / busbw over that time, so a rank that waits reads slower "
                "than its link)",
                [
                    "rank",
                    "op [group]" if several else "op",
                    "calls",
                    "time ms",
                    "mean size",
                    "algbw",
                    "busbw",
                ],
                [
                    [
                        rank_label(r["rank"]),
                        f"{r['op']} [{r.get('group') or UNNAMED_GROUP}]" if several else r["op"],
                        str(r["calls"]),
                        _ms(r["time_ns"]),
                        _bytes(r["mean_bytes"]),
                        _gbs(r["algbw"]),
                        _gbs(r["busbw"]),
                    ]
                    for r in m["collectives"]
                ],
            )
        )
    if m["stragglers"]:
        out.append(
            (
                "Stragglers",
                ["rank", "last to arrive (share of collectives)", "median step ms (every step)", "straggler"],
                [
                    [
                        rank_label(r["rank"]),
                        _num(r["last_arrival_frac"], ".1%"),
                        _ms(r["median_step_ns"]),
                        "yes" if r["straggler"] else "no",
                    ]
                    for r in m["stragglers"]
                ],
            )
        )
    return [condensed(t) for t in out]


def finding_lines(f: dict[str, Any]) -> list[str]:
    """Detail lines under a finding's title: what, where, evidence, recoverable time (the fixes are
    rendered apart, as code: `human.fix_blocks`)."""
    lines = [prose(f["detail"])]
    where = [f"ranks: {rank_list(f['ranks'], sep=', ')}"] if f.get("ranks") else []
    where += [f"{k}: {', '.join(map(str, f[k][:8]))}" for k in ("layers", "steps") if f.get(k)]
    if where:
        lines.append("; ".join(where))
    if f.get("evidence"):
        lines.append("evidence: " + evidence_line(f["evidence"]))
    if f.get("recoverable_s") is not None:
        lines.append(f"recoverable: ~{f['recoverable_s'] * 1e3:.1f} ms per step")
    return lines


def summary_line(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    st = s["steps"]
    bits = [rank_count(doc["ranks"]), f"{len(doc['sources'])} input(s)"]
    if st.get("count"):
        seen = st.get("recorded") or st["count"]
        counted = f"{seen} steps" + (f" ({st['count']} timed)" if seen != st["count"] else "")
        bits.append(f"{counted}, median {st['median_ms']:.1f} ms, p90 {st['p90_ms']:.1f} ms")
    if s.get("tflops_median") is not None:
        bits.append(
            f"{flop_rate(s['tflops_median'])} per {per(doc)}"
            + (f", MFU {percent(s['mfu'])}" if s.get("mfu") is not None else "")
        )
    if s.get("overflows"):
        bits.append(f"{s['overflows']} overflow(s)")
    bits.append(f"{s['findings']} finding(s)")
    shifted = (doc.get("layout") or {}).get("step_offsets")
    if shifted:  # the report's step numbers are not the trace files' on those ranks
        moved = ", ".join(f"rank {r} {d:+d}" for r, d in shifted.items())
        bits.append(f"steps counted from each rank's attach, aligned by their ends ({moved})")
    return " · ".join(bits)
