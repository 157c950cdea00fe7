"""JobView -> the text cells of each table, keyed by row (pure: tested without textual).

The first cell of every row is its key (SyncTable sorts by looking rows up through it).
"""

from __future__ import annotations

from typing import Any

from diag import schema
from diag.ranks import rank_label, rank_list
from diag.tui import fmt
from diag.tui.view import JobView, RankRow

RANK_COLUMNS = (
    "rank",
    "host",
    "step",
    "step ms",
    "mean ms",
    "comm",
    "memory peak / capacity",
    "last collective",
    "health",
)
# a collective of a group is one operation that each member rank records: calls and bytes per rank
COMM_COLUMNS = (
    "group / op",
    "size",
    "calls per rank",
    "bytes per rank",
    "mean bytes",
    "latency ms",
    "last ms",
    "busbw GB/s",
)
LAYER_COLUMNS = ("module", "ms/step", "fwd ms", "bwd ms", "GFLOP/step", "TFLOP/s")
OVERFLOW_COLUMNS = ("step", "overflow on ranks", "scale before", "scale after", "source")
GPU_COLUMNS = (
    "gpu",
    "util",
    "memory",
    "power / limit W",
    "SM / mem MHz",
    "temp C",
    "throttle",
    "PCIe tx / rx",
    "NVLink tx / rx",
    "ECC",
    "Xid",
)

# sort keys of the ranks table, cycled with `s`
RANK_SORTS: dict[str, Any] = {
    "rank": lambda r: r.rank,
    "step ms": lambda r: -(r.step_ms or 0),
    "comm": lambda r: -(r.comm_share or 0),
    "memory": lambda r: -((r.mem_peak or 0) / r.mem_capacity if r.mem_capacity else r.mem_peak or 0),
    "health": lambda r: (r.health == "ok", r.rank),
}


def rank_cells(r: RankRow) -> tuple[str, ...]:
    return (
        rank_label(r.rank),
        r.host,
        fmt.num(r.step),
        fmt.ms(r.step_ms),
        fmt.ms(r.mean_ms),
        fmt.pct(r.comm_share),
        fmt.mem(r.mem_peak, r.mem_capacity),
        r.last_comm,
        r.health,
    )


def rank_rows(v: JobView) -> dict[str, tuple[str, ...]]:
    return {rank_label(r.rank): rank_cells(r) for r in v.rank_rows}


def comm_rows(v: JobView) -> dict[str, tuple[str, ...]]:
    out = {}
    for c in v.comm_rows:
        key = f"{c.group} / {c.op}"
        out[key] = (
            key,
            str(c.group_size),
            fmt.count(c.per_rank_count),
            fmt.nbytes(c.per_rank_bytes),
            fmt.nbytes(c.bytes / c.count if c.count else None),
            fmt.ms(c.mean_latency / 1e6, 3),
            fmt.ms(c.last_dur / 1e6, 3),
            fmt.num(c.busbw, 3),
        )
    return out


def layer_rows(v: JobView) -> dict[str, tuple[str, ...]]:
    return {
        r.module: (
            r.module,
            fmt.ms(r.ms_per_step, 2),
            fmt.ms(r.fwd_ms, 2),
            fmt.ms(r.bwd_ms, 2),
            fmt.num(r.gflops_per_step, 3),
            fmt.num(r.tflops_s, 3),
        )
        for r in v.layer_rows
    }


def overflow_rows(v: JobView) -> dict[str, tuple[str, ...]]:
    out = {}
    for r in v.overflow_rows:
        ranks = rank_list(sorted(set(r["ranks"])), limit=None)
        out[str(r["step"])] = (
            str(r["step"]),
            ranks,
            fmt.num(r["scale_before"], 0),
            fmt.num(r["scale_after"], 0),
            str(r["source"] or "-"),
        )
    return out


def _pair(a: Any, b: Any, f: Any = fmt.num) -> str:
    return f"{f(a)} / {f(b)}"


def gpu_rows(v: JobView) -> dict[str, tuple[str, ...]]:
    out = {}
    for g in v.gpu_rows:
        key = f"{g.get('host', '?')}:{g.get('index')}"
        out[key] = (
            key,
            fmt.pct(g["util"] / 100 if g.get("util") is not None else None),
            fmt.mem(g.get("mem_used"), g.get("mem_total")),
            _pair(g.get("power_w"), g.get("power_limit_w"), lambda x: fmt.num(x, 0)),
            _pair(g.get("sm_clock"), g.get("mem_clock")),
            fmt.num(g.get("temp_c")),
            ",".join(g.get("throttle") or []) or "-",
            _pair(g.get("pcie_tx"), g.get("pcie_rx"), fmt.rate),
            _pair(g.get("nvlink_tx"), g.get("nvlink_rx"), fmt.rate),
            fmt.num(g.get("ecc_errors")),
            ",".join(str(x) for x in g.get("xid") or []) or "-",
        )
    return out


def summary_text(v: JobView, source: str) -> str:
    lay = v.layout
    parts = [f"{v.ranks} ranks on {v.hosts} host(s)" if v.ranks else "waiting for data"]
    par = " ".join(f"{k.upper()}={lay[k]}" for k in schema.PARALLEL_KEYS if lay.get(k) is not None)
    if par:
        parts.append(par)
    if lay.get("zero_stage") is not None:
        parts.append(f"ZeRO-{lay['zero_stage']}")
    if lay.get("dtype"):
        parts.append(str(lay["dtype"]))
    if lay.get("micro_batch") is not None:
        gbs = f", global {lay['global_batch']}" if lay.get("global_batch") is not None else ""
        parts.append(f"micro-batch {lay['micro_batch']}{gbs}")
    if lay.get("roles"):  # the process groups the collectives table names (tp:12 / all_reduce)
        parts.append("groups " + " ".join(f"{r}({s})" for r, s in sorted(lay["roles"].items())))
    if v.state != "live":  # a followed job that ended, or whose agent detached, is not live any more
        source = f"{v.state.upper()}: {source.removeprefix('live ')}"
    line1 = f"{source} | " + ", ".join(parts)
    sps = f"{1e3 / v.mean_ms:.2f}" if v.mean_ms else "-"
    line2 = (
        f"step {fmt.num(v.last_step)}: {fmt.ms(v.last_ms)} ms (mean {fmt.ms(v.mean_ms)} ms, "
        f"{sps} steps/s, {fmt.num(v.samples_per_s)} samples/s) | loss scale "
        f"{fmt.num(v.loss_scale, 0)}, skipped {v.skipped_steps} | {v.events} events"
    )
    return f"{line1}\n{line2}\n{spark_scale(v)}"


def spark_scale(v: JobView) -> str:
    """The scale of the sparkline under the summary: which steps it covers, its lowest and highest."""
    s = v.step_series
    if not s:
        return "step time: no steps yet"
    return (
        f"step time, last {len(s)} step(s) (sparkline below, bar height from {fmt.ms(min(s))} to "
        f"{fmt.ms(max(s))} ms)"
    )
