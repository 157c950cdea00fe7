"""The short summary `diag demo` prints: a glance at each signal the agent recorded, from the trace
alone (pandas + rich; the full rule-based analysis is `diag analyze`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from diag.metrics import bandwidth
from diag.metrics.layer_stats import leaf_layers
from diag.trace.model import Trace
from diag.units import binary_bytes as _bytes
from diag.units import ms as _ms


def _row(t: Table, *cells: str) -> None:
    """A row of plain text: a module name, a source or a value the job gave is never read as rich
    markup (`[/x]` in a name stopped `diag analyze` with a MarkupError once: diag.report.terminal)."""
    t.add_row(*(Text(c) for c in cells))


def job_table(trace: Trace) -> Table:
    t = Table(title="job", show_header=False)
    layout = trace.layout()
    steps = trace.steps.dropna(subset=["dur"])
    for key in ("world_size", "zero_stage", "dtype", "tp", "dp"):
        if key in layout:
            _row(t, key, str(layout[key]))
    _row(t, "steps recorded", str(trace.steps.groupby("rank").size().to_dict()))
    if not steps.empty:
        per_rank = steps.groupby("rank")["dur"].median()
        _row(t, "median step time (ms)", ", ".join(f"r{r}: {_ms(v)}" for r, v in per_rank.items()))
    return t


def layers_table(trace: Trace, top: int = 8) -> Table:
    t = Table(title=f"top layers (leaf modules, sampled steps, rank 0, top {top} by time)")
    for col in ("module", "fwd ms", "bwd ms", "GFLOP"):
        t.add_column(col, justify="left" if col == "module" else "right")
    layers = leaf_layers(trace.layers[trace.layers["rank"] == 0])
    if layers.empty:
        return t
    by = layers.pivot_table(
        index="module", columns="phase", values="dur", aggfunc="sum", observed=True
    ).fillna(0)
    flops = layers.groupby("module", observed=True)["flops"].sum()
    by["total"] = by.sum(axis=1)
    for name, row in by.sort_values("total", ascending=False).head(top).iterrows():
        _row(t, str(name), _ms(row.get("fwd", 0)), _ms(row.get("bwd", 0)), f"{flops.get(name, 0) / 1e9:.3f}")
    return t


def comms_table(trace: Trace) -> Table:
    t = Table(title="collectives (all ranks)")
    for col in ("op", "count", "bytes", "time ms", "busbw GB/s"):
        t.add_column(col, justify="left" if col == "op" else "right")
    comms = trace.comms
    if comms.empty:
        return t
    g = comms.groupby(comms["op"].astype(str))
    for op, df in sorted(g, key=lambda kv: -kv[1]["dur"].sum()):
        _row(
            t,
            op,
            str(len(df)),
            _bytes(df["bytes"].sum()),
            _ms(df["dur"].sum()),
            f"{bandwidth.total_busbw(df):.3f}",
        )
    return t


def memory_table(trace: Trace) -> Table:
    t = Table(title="memory (peak per rank)")
    for col in ("rank", "device", "peak allocated", "peak RSS"):
        t.add_column(col, justify="right")
    mem = trace.memory
    for rank, df in mem.groupby("rank"):
        peak = df["peak"].dropna()
        _row(
            t,
            str(rank),
            str(df["device"].iloc[-1]),
            _bytes(peak.max()) if len(peak) else "-",
            _bytes(df["rss"].dropna().max()) if df["rss"].notna().any() else "-",
        )
    return t


def overflow_table(trace: Trace) -> Table:
    t = Table(title="fp16 overflows (steps skipped)")
    for col in ("rank", "step", "loss scale", "source"):
        t.add_column(col, justify="right")
    ov = trace.overflow
    for _, row in ov[ov["overflow"] == True].iterrows():  # noqa: E712 - pandas column compare
        _row(
            t,
            str(row["rank"]),
            str(row["step"]),
            f"{row['scale_before']:g} -> {row['scale_after']:g}",
            str(row["source"]),
        )
    return t


def health_line(trace: Trace) -> str:
    errors = int(trace.errors["count"].sum()) if not trace.errors.empty else 0
    stats = trace.stats.groupby("rank").tail(1)
    dropped = sum(sum(d.values()) for d in stats["dropped"] if isinstance(d, dict))
    return (
        f"agent health: {errors} collector errors, {dropped} records dropped, "
        f"{len(trace.problems)} load problems"
    )


def print_summary(trace: Trace, console: Console | None = None) -> None:
    console = console or Console()
    for table in (
        job_table(trace),
        layers_table(trace),
        comms_table(trace),
        memory_table(trace),
        overflow_table(trace),
    ):
        console.print(table)
    console.print(health_line(trace))
