"""The report's throughput section: measured TFLOP/s and MFU per step and per rank, the model-FLOPs
view from Megatron's formula beside it, and the job's own printed TFLOPs when a log has them.
Definitions: diag/metrics/throughput.py, model_flops.py and peaks.py (docs/analyze.md)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import pandas as pd

from diag.metrics import model_flops, peaks, throughput
from diag.report.records import Records

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

MEASURED_COUNTED = (
    "measured: FLOPs counted from the shapes of the matmul/attention ops each rank ran inside "
    "its outermost module records on sampled steps (forward, backward and recomputation; that "
    "rank's share under TP/PP), held between samples; TFLOP/s = FLOPs / step time, median over "
    "steady steps that were not sampled."
)
MODEL_COUNTED = (
    "model: Megatron's analytic FLOPs of one iteration / (iteration time x world size), "
    "recomputation counted only as that formula does."
)


def how_counted(measured: bool, model: bool) -> str:
    """How the views shown were counted: only those the job has (a DDP job with no model shape
    was told of Megatron's formula, which nothing in its report used)."""
    return " ".join(text for text, shown in ((MEASURED_COUNTED, measured), (MODEL_COUNTED, model)) if shown)


def _device(trace: Trace, layout: dict[str, Any]) -> str | None:
    if layout.get("device_name"):
        return str(layout["device_name"])
    dev = trace.memory["device"].dropna().astype(str) if "device" in trace.memory else pd.Series()
    return "cpu" if (dev == "cpu").any() else None


def _peak(trace: Trace, layout: dict[str, Any], override: float | None) -> tuple[dict[str, Any] | None, str]:
    device, dtype = _device(trace, layout), layout.get("dtype")
    if override:
        return {
            "device": device or "?",
            "dtype": peaks.matmul_dtype(dtype) or dtype,
            "tflops": override,
            "source": "--peak-tflops",
        }, ""
    found = peaks.lookup(device, dtype)
    return (asdict(found), "") if found else (None, peaks.unknown_reason(device, dtype))


def _batch(shape: dict[str, Any], layout: dict[str, Any], steps: pd.DataFrame) -> int | None:
    for v in (shape.get("global_batch_size"), layout.get("global_batch")):
        if isinstance(v, int | float) and v > 0:
            return int(v)
    samples = pd.to_numeric(steps.get("samples", pd.Series(dtype=float)), errors="coerce").dropna()
    return int(samples.median()) if len(samples) else None


def _model_view(
    trace: Trace, shape: dict[str, Any], layout: dict[str, Any], step_s: float | None, peak: float | None
) -> dict[str, Any] | None:
    batch = _batch(shape, layout, trace.steps)
    got = model_flops.iteration_flops(shape, batch) if batch else None
    if got is None:
        return None
    flops, formula = got
    world = int(shape.get("world_size") or layout.get("world_size") or len(trace.ranks) or 1)
    out: dict[str, Any] = {
        "formula": formula,
        "flops_per_iteration": flops,
        "batch": batch,
        "world_size": world,
        "step_s": step_s,
        "tflops_per_gpu": None,
        "mfu": None,
    }
    if step_s:
        out["tflops_per_gpu"] = flops / (step_s * world) / 1e12
        out["mfu"] = out["tflops_per_gpu"] / peak if peak else None
    log = trace.frame("log_step")
    if "iter_ms" in log.columns and log["iter_ms"].notna().any():  # the same formula on the log's times
        ms = pd.to_numeric(log["iter_ms"], errors="coerce")
        out["tflops_on_log_times"] = float((flops / (ms / 1e3 * world) / 1e12).median())
    return out


def section(
    trace: Trace, metrics: Metrics, peak_tflops: float | None = None, model: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The `throughput` part of the report document (its tables `Records`)."""
    layout = trace.layout()
    peak, why = _peak(trace, layout, peak_tflops)
    value = peak["tflops"] if peak else None
    shape = {**(layout.get("model") or {}), **(model or {})}
    seq = shape.get("seq_length")
    dp = throughput.data_parallel(layout)
    counted = metrics.reduce(throughput.StepFlops())  # FLOPs per sampled (rank, step)
    rows = throughput.per_step_of(metrics.steps, counted, value, int(seq) if seq else None, dp)
    ranks = throughput.per_rank(rows)
    quiet = throughput.job_steps(rows)  # read by the job's rates and step time alike
    known = ranks.dropna(subset=["tflops"])
    log = trace.frame("log_step")
    printed = (
        pd.to_numeric(log["tflops"], errors="coerce").dropna()
        if "tflops" in log.columns
        else pd.Series(dtype=float)
    )
    model_view = _model_view(trace, shape, layout, throughput.job_step_s(rows, quiet), value)
    return {
        "counted": how_counted(bool(len(known)), model_view is not None),
        # what one rank runs on, for the human reports: "rank" where the ranks ran on CPUs (the
        # demo, CI), not "GPU" (the JSON keys keep `tflops_per_gpu`)
        "per": "rank" if _device(trace, layout) == "cpu" else "GPU",
        "peak": peak,
        "peak_note": why,
        "measured": {
            "tflops_per_gpu": known["tflops"].mean() if len(known) else None,
            "mfu": known["mfu"].mean() if len(known) and value else None,
            "flops_per_step": known["flops_per_step"].sum() if len(known) else None,
            **throughput.job_rates(rows, quiet),  # the job's samples/s, tokens/s (per rank: `per_rank`)
        },
        "dp": dp,
        "model": model_view,
        "log_tflops_median": printed.median() if len(printed) else None,
        "per_rank": Records(ranks),
        "per_step": Records(rows),  # one per (rank, step): rows when read
    }
