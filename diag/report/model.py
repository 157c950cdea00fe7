"""The report document: everything a renderer shows, as plain JSON-able data (schema in docs/analyze.md).

Bump `VERSION` when a field changes meaning or disappears; adding fields keeps the version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec

import pandas as pd

from diag import __version__
from diag.metrics.stage import Metrics
from diag.ranks import rank_labels
from diag.report import kept_ranks, mfu, trace_doc
from diag.report.records import Records, materialize, plain
from diag.trace.heap import release_memory

if TYPE_CHECKING:
    from diag.findings import Finding
    from diag.trace.model import Trace

SCHEMA = "diag.analyze"
_P = ParamSpec("_P")
VERSION = 2  # 2: the per-(rank, step) tables keep some ranks' rows above kept_ranks.ROWS


def rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A table as records (the diff document's)."""
    return table(df).rows()


def table(df: pd.DataFrame) -> Records:
    """A table of the report, made into rows when read (`Records`). The temporaries that computed
    it are freed by now: their heap pages go back to the OS first (`run_all` does it after each
    rule), or the next table's arrays go above them."""
    release_memory()
    return Records(df)


def _steps_summary(st: pd.DataFrame, recorded: pd.DataFrame) -> dict[str, Any]:
    """`count`: steps with a duration (the figures' base); `recorded`: every step recorded, as the
    job's log counts them (a trace's first step has no earlier boundary, so no duration)."""
    seen = int(recorded["step"].nunique()) if "step" in recorded else 0
    if st.empty:
        return {"count": 0, "recorded": seen}
    ms = st["dur_ns"].astype(float) / 1e6
    return {
        "count": int(st["step"].nunique()),
        "recorded": max(seen, int(st["step"].nunique())),
        "median_ms": ms.median(),
        "p90_ms": ms.quantile(0.9),
        "max_ms": ms.max(),
    }


def _loss_scale(trace: Trace) -> pd.DataFrame:
    log = trace.frame("log_step")
    if "loss_scale" in log.columns and log["loss_scale"].notna().any():
        return log.dropna(subset=["loss_scale"])[["step", "loss_scale"]].drop_duplicates("step")
    ov = trace.overflow
    if "scale_after" in ov.columns and ov["scale_after"].notna().any():
        ov = ov.dropna(subset=["scale_after"]).sort_values("step")
        first = ov.iloc[:1].assign(step=ov["step"].iloc[0] - 1, scale_after=ov["scale_before"].iloc[0])
        both = pd.concat([first.dropna(subset=["scale_after"]), ov])
        return (
            both.groupby("step")["scale_after"]
            .min()
            .reset_index()
            .rename(columns={"scale_after": "loss_scale"})
        )
    return pd.DataFrame(columns=["step", "loss_scale"])


def _overflows(trace: Trace) -> int:
    from diag.metrics.overflows import skipped_steps

    return skipped_steps(trace.overflow)


def _stragglers(metrics: Metrics, findings: list[Finding], failures: dict[str, str]) -> pd.DataFrame:
    """The last-arrival measure per rank, with the straggler rule's verdict beside it (one answer);
    no verdict (None) where the windowed pass did not run the rule."""
    df = metrics.stragglers
    if _not_run(failures.get("straggler", "")):
        return df.assign(straggler=None)
    flagged = {r for f in findings if f.rule == "straggler" for r in f.ranks}
    return df.assign(straggler=[int(r) in flagged for r in df["rank"]])


def _headline(tp: dict[str, Any], log: pd.DataFrame) -> tuple[Any, Any, str | None]:
    """(TFLOP/s per GPU, MFU, which) for the summary: measured, else the model view (on the trace's
    step times, else on the log's own iteration times), else the figure the log printed. A printed
    0.00 is a value below the log's rounding, not a measurement: it is never the headline."""
    if tp["measured"]["tflops_per_gpu"] is not None:
        return tp["measured"]["tflops_per_gpu"], tp["measured"]["mfu"], "measured"
    model = tp["model"] or {}
    if model.get("tflops_per_gpu") is not None:
        return model["tflops_per_gpu"], model["mfu"], "model"
    if model.get("tflops_on_log_times") is not None:
        return model["tflops_on_log_times"], None, "model on the log's times"
    printed = log["tflops"].median() if "tflops" in log.columns else None
    if printed is None or pd.isna(printed) or printed <= 0:
        return None, None, None
    return printed, None, "log"


def _with_rows(make: Callable[_P, dict[str, Any]]) -> Callable[_P, dict[str, Any]]:
    """`make`'s document with every table as its rows: the plain document the renderers read (typed
    as `make`, so a caller's arguments are checked against `document`'s)."""

    def made(*args: _P.args, **kwargs: _P.kwargs) -> dict[str, Any]:
        return materialize(make(*args, **kwargs))

    return made


def document(
    trace: Trace,
    findings: list[Finding],
    failures: dict[str, str],
    metrics: Metrics | None = None,
    *,
    peak_tflops: float | None = None,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report document for one analysis, its tables `Records` (rows when read: `json_report.write`
    holds a chunk of rows at a time, `materialize` the whole): the trace's `metrics` (the ones the
    rules read; made here when not given) and the findings. `peak_tflops` overrides the device
    table's peak, `model` (Megatron argument names) the model shape the trace or log recorded."""
    metrics = metrics if metrics is not None else Metrics(trace)
    steps = metrics.step_times
    log = trace.frame("log_step")
    partial: list[str] = []  # sections the windowed pass made without the records it withholds
    held = _Held(trace, partial)
    tp = held("throughput", mfu.section, metrics, peak_tflops, model)
    tflops, util, which = _headline(tp, log)
    shown = kept_ranks.shown(steps, trace.memory, findings)  # None: every rank's rows
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "version": VERSION,
        "diag_version": __version__,
        "sources": list(trace.sources),
        "ranks": trace.ranks,
        "rank_labels": rank_labels(trace.ranks),  # -20267 -> "pid 20267": a process with no rank
        "layout": trace.layout(),
        "problems": [{"path": p.path, "line": p.line, "message": str(p)} for p in trace.problems],
        "summary": {
            "steps": _steps_summary(steps, trace.steps),
            "tflops_median": tflops,
            "tflops_source": which,
            "mfu": util,
            "overflows": _overflows(trace),
            "findings": len(findings),
        },
        "metrics": {
            "breakdown": table(metrics.breakdown),
            "step_split": table(metrics.step_split),
            "overlap": table(metrics.overlap),
            "collectives": table(metrics.collectives),
            "bandwidth_by_size": table(held.figure("bandwidth_by_size", metrics)),
            "stragglers": table(_stragglers(metrics, findings, failures)),
            "step_times": table(kept_ranks.only(steps, shown)),
            "loss_scale": table(_loss_scale(trace)),
            "steps_joined": table(trace.frame("step_join")),  # trace + log by iteration (importers/join.py)
        },
        "throughput": tp,
        "layers": held(
            "layers",
            lambda t: trace_doc.layers(t, tp["peak"]["tflops"] if tp["peak"] else None, metrics=metrics),
        ),
        "steps": held("steps", lambda t: trace_doc.steps(tp["per_step"], t), partial=tp),
    }
    if shown is not None and isinstance(tp.get("per_step"), Records):
        # `steps` read every rank's rows: the others' freed before the sections after it are made
        # (held, ~60 bytes a rank-step were the last stage's high-water mark, at the memory section)
        tp["per_step"] = Records(kept_ranks.only(tp["per_step"].frame, shown))
    doc.update(
        {
            "step_timeline": held("step_timeline", trace_doc.step_timeline),
            "memory": trace_doc.memory(trace, shown),
            "rank_steps": {"rows": len(steps), "limit": kept_ranks.ROWS, "ranks": shown},
            "overflows": trace_doc.overflows(trace),
            "findings": [f.to_dict() for f in findings],
            "rule_failures": dict(failures),
        }
    )
    doc = plain(doc)
    if hasattr(trace, "bare"):  # the windowed pass (`windowed_stage`): how it read the trace
        not_run = sorted(k for k, v in failures.items() if _not_run(v))
        doc["windowed"] = {"partial": partial, "not_run": not_run}
    return doc


def _not_run(failure: str) -> bool:
    return failure.startswith("not run under the windowed pass")


class _Held:
    """A report section of the trace; under the windowed pass, one that reads the per-call or
    per-layer records outside a reduction is made without them (as if none were recorded) and
    named in the document's `windowed.partial`, so no reader takes it for the whole."""

    def __init__(self, trace: Trace, partial: list[str]) -> None:
        self.trace, self.partial = trace, partial
        self.made: dict[str, Any] = {}

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any, partial: Any = None) -> Any:
        """`fn(trace, *args)`; `partial`: a section this one is made of (partial: this one too)."""
        from diag.metrics.withheld import WholeOnly

        if partial is not None and any(self.made[n] is partial for n in self.partial if n in self.made):
            self.partial.append(name)
        try:
            self.made[name] = out = fn(self.trace, *args)
            return out
        except WholeOnly:
            self.partial.append(name)
            self.made[name] = out = fn(self.trace.bare(), *args)  # type: ignore[attr-defined]
            return out

    def figure(self, name: str, metrics: Metrics) -> pd.DataFrame:
        from diag.metrics.withheld import WholeOnly

        try:
            return getattr(metrics, name)
        except WholeOnly:
            self.partial.append(name)
            return getattr(Metrics(self.trace.bare()), name)  # type: ignore[attr-defined]


build = _with_rows(document)  # `document` with every table as its rows
