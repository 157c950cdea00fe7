"""Analyze diag traces, PyTorch profiler (Kineto) traces and DeepSpeed/Megatron logs post-mortem.

Inputs may be mixed (a trace plus the log of the same job); each one's kind is detected by content.
Unreadable inputs are reported one line each on stderr (exit code 2) and the rest is analyzed; a log
showing that the job failed (a rank raised, timed out or was killed) is reported the same way, exit 1;
so is a trace that shows it (job_crash from the trace alone: an exception on record, a dead rank).
Large inputs are read in worker processes (about one a core the process is given, at most 4):
DIAG_WORKERS=N sets the most (0: everything in this process).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from diag.cli.output import write_report
from diag.errors import DiagError

if TYPE_CHECKING:
    from diag.importers import Progress

PROGRESS_BYTES = 32 << 20  # show a progress bar when the inputs are bigger than this


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="diag trace dir, Kineto trace files/dirs (.json, .json.gz), training logs",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON (schema v1)")
    parser.add_argument("--markdown", metavar="FILE", help="also write a Markdown report")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    parser.add_argument("--rules", metavar="A,B", help="run only these analyzer rules")
    parser.add_argument("-q", "--quiet", action="store_true", help="findings only, no tables")
    parser.add_argument(
        "--each-run",
        action="store_true",
        help="inputs from different runs: one report per run (else they are refused)",
    )
    parser.add_argument(
        "--comm-pattern",
        metavar="REGEX",
        action="append",
        default=[],
        help="also count GPU kernels whose name matches REGEX as communication "
        "(repeatable; adds to the DIAG_COMM_PATTERN environment variable)",
    )
    parser.add_argument(
        "--ds-config-out",
        metavar="FILE",
        help="write the job's ds_config with each finding's first suggested patch merged",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        metavar="N",
        help="the device's dense peak TFLOP/s for MFU, where diag's table has none (CPU, "
        "other GPUs) or to override it",
    )
    parser.add_argument(
        "--ranks",
        metavar="LIST",
        help="analyze only these ranks, e.g. 0-7,12 (other ranks' files are not read when they "
        "say their rank up front)",
    )
    parser.add_argument(
        "--steps",
        metavar="A:B",
        help="analyze only steps A up to, not including, B (A: or :B leave an end open); the first "
        "selected step counts as the warm-up",
    )
    parser.add_argument(
        "--windowed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read a diag trace a window of steps at a time, never its calls whole (default: when "
        "its files exceed half the memory available); rules not yet reduced for it are reported "
        "not run",
    )
    parser.add_argument(
        "--window-steps",
        type=int,
        metavar="N",
        help="--windowed: steps a window (default: about 18,000 records a window, the records a step counted "
        "at the first rank file's start)",
    )
    parser.add_argument(
        "--model",
        metavar="K=V,...",
        help="model shape for the model-FLOPs view when the trace/log has none: "
        "layers=,hidden=,seq=,vocab=,batch= (+ heads=,ffn=,kv_heads=,swiglu=,formula=)",
    )


@contextmanager
def _progress(paths: list[str], quiet: bool) -> Iterator[Progress | None]:
    """A rich progress bar over the input bytes, for big inputs on a terminal."""
    from diag.importers import input_files, size_of

    items, _ = input_files(paths)
    total = sum(size_of(p) for p, _ in items)
    if quiet or total < PROGRESS_BYTES or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("loading"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("load", total=total)
        yield lambda _path, size: bar.advance(task, size)


def run(args: argparse.Namespace) -> int:
    from diag.analyzers import registered_rules
    from diag.importers.runs import MixedRuns

    _comm_patterns(args.comm_pattern)
    only = [r.strip() for r in args.rules.split(",") if r.strip()] if args.rules else None
    _model_option(args.model)  # a bad --model is one line before any input is read
    from diag.trace.window import parse

    args.window = parse(args.ranks, args.steps)
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise DiagError(f"--peak-tflops must be a positive number of TFLOP/s, got {args.peak_tflops:g}")
    if only:
        unknown = sorted(set(only) - set(registered_rules()))
        if unknown:
            raise DiagError(
                f"unknown rule(s): {', '.join(unknown)} (known: "
                f"{', '.join(sorted(registered_rules())) or 'none'})"
            )
    try:
        return _analyze(args.paths, args, only)
    except MixedRuns as e:
        if not args.each_run:
            raise
        codes = []
        for i, paths in enumerate(e.runs, 1):
            if not args.json:
                print(f"== run {i} of {len(e.runs)}: {' '.join(paths)}")
            codes.append(_analyze(paths, args, only, i))
        return max(codes)


def _analyze(paths: list[str], args: argparse.Namespace, only: list[str] | None, run_no: int = 0) -> int:
    from diag.analyzers import run_all
    from diag.importers import load_inputs
    from diag.metrics.stage import Metrics
    from diag.report import model
    from diag.trace.reader import Unreadable

    try:
        stage = _windowed(paths, args)
        if stage is None:
            with _progress(paths, args.quiet) as progress:
                trace = load_inputs(paths, progress, args.window, slim=True)
    except Unreadable as e:  # nothing readable: still one line per bad input
        for p in e.per_file():
            print(f"diag analyze: error: {p}", file=sys.stderr)
        return e.exit_code
    # the one analysis stage: the rules and the report read the same figures
    trace = trace if stage is None else stage.trace

    def analysis(metrics: Metrics) -> tuple[list[Any], dict[str, str], dict[str, Any]]:
        findings, failures = run_all(trace, only, metrics)
        doc = model.document(
            trace, findings, failures, metrics, peak_tflops=args.peak_tflops, model=_model_option(args.model)
        )
        return findings, failures, doc

    findings, failures, doc = analysis(Metrics(trace)) if stage is None else stage.settle(analysis)
    if stage is not None:
        _windowed_note(stage, failures, args)
    _render(doc, args, run_no)
    for p in doc["problems"]:
        print(f"diag analyze: error: {p['message']}", file=sys.stderr)
    failed = [p for p in trace.problems if getattr(p, "job_failed", False)]
    if not failed:  # no log said so, but the trace shows it (an exception on record, a rank that died)
        crash = next((f for f in findings if f.rule == "job_crash" and f.severity == "critical"), None)
        if crash is not None:
            print(f"diag analyze: error: job failed: {crash.title}", file=sys.stderr)
            return 2 if trace.problems else 1
    return 2 if len(trace.problems) > len(failed) else 1 if failed else 0


def _windowed(paths: list[str], args: argparse.Namespace) -> Any:
    """The windowed pass's first pass (`windowed_stage.read`) where it applies: one diag trace
    directory, asked for (`--windowed`) or larger than half the memory available; else None (read
    whole, as a trace the pass cannot read exactly is: said on stderr when asked for)."""
    if args.windowed is False or len(paths) != 1 or not os.path.isdir(paths[0]):
        return None
    from diag.importers.detect import captures
    from diag.metrics import windowed_stage

    if captures(paths[0]) > 1:
        return None  # (one run per capture: `detect.expand`)

    size = windowed_stage.input_bytes(paths[0])
    if size is None or not (args.windowed or size > windowed_stage.available_bytes() / 2):
        return None
    from diag.analyzers import registered_rules

    registered_rules()  # (their early reductions: `reduction.early`, computed in the first pass)
    if args.window_steps is not None and args.window_steps < 1:
        raise DiagError(f"--window-steps must be a positive number of steps, got {args.window_steps}")
    try:
        return windowed_stage.read(paths[0], args.window, args.window_steps)
    except windowed_stage.NotWindowed as e:
        print(f"diag analyze: reading the trace whole, not a window at a time: {e}", file=sys.stderr)
        return None


def _windowed_note(stage: Any, failures: dict[str, str], args: argparse.Namespace) -> None:
    """One line on stderr: how the trace was read, and the rules not run for it."""
    skipped = sorted(k for k, v in failures.items() if v.startswith("not run under the windowed pass"))
    print(
        f"diag analyze: read {stage.path} {stage.size} steps at a time in {stage.passes} pass(es)"
        + (f"; not run (they read every call or layer record): {', '.join(skipped)}" if skipped else ""),
        file=sys.stderr,
    )


def _comm_patterns(patterns: list[str]) -> None:
    """--comm-pattern joins DIAG_COMM_PATTERN in the environment, where the importers (and their
    worker processes) read it; a pattern that is not a regex is one line, exit 2."""
    from diag.vocab import COMM_PATTERN_ENV, check_comm_pattern

    old = os.environ.get(COMM_PATTERN_ENV, "").strip()
    joined = "|".join(f"(?:{p})" for p in ([old] if old else []) + patterns)
    os.environ[COMM_PATTERN_ENV] = check_comm_pattern(joined)


def _write_numbered(path: str, run_no: int, text: str) -> None:
    """`path`, or report.md -> report.run2.md under --each-run (one file per run, each named on
    stderr: the file asked for is not written)."""
    if run_no:
        stem, ext = os.path.splitext(path)
        path = f"{stem}.run{run_no}{ext}"
    write_report(path, text)
    if run_no:
        print(f"diag analyze: run {run_no}: wrote {path}", file=sys.stderr)


def _model_option(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    from diag.metrics.model_flops import from_options

    try:
        return from_options(text)
    except ValueError as e:
        raise DiagError(str(e)) from None


def _write_ds_config(doc: dict[str, Any], path: str) -> None:
    """The merged ds_config as JSON, and one line on stderr saying what went in and what did not."""
    import json

    from diag.report.human import merged_ds_config

    cfg, used, skipped = merged_ds_config(doc)
    if not cfg:
        raise DiagError("--ds-config-out: the trace records no ds_config and no finding suggests a patch")
    write_report(path, json.dumps(cfg, indent=2) + "\n")
    print(
        f"diag analyze: wrote {path}: the job's ds_config with {len(used)} patch(es) merged"
        + (f" ({'; '.join(used)})" if used else "")
        + (f"; alternatives not merged: {'; '.join(skipped)}" if skipped else ""),
        file=sys.stderr,
    )


def _render(doc: dict[str, Any], args: argparse.Namespace, run_no: int = 0) -> None:
    """`doc`: `model.document`'s, its tables `Records`: `--json` writes a table a chunk of rows at a
    time, the other renderers read its rows as they go (never the per-(rank, step) tables whole)."""
    if args.markdown:
        from diag.report import markdown

        _write_numbered(args.markdown, run_no, markdown.render(doc))
    if args.html:
        from diag.report import html

        _write_numbered(args.html, run_no, html.render(doc))
    if args.ds_config_out:
        _write_ds_config(doc, args.ds_config_out)
    if args.json:
        from diag.report import json_report

        json_report.write(doc, sys.stdout)
    else:
        from rich.console import Console

        from diag.report import terminal

        terminal.render(doc, Console(), quiet=args.quiet)
