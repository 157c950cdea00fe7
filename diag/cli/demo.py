"""Run a small real 2-rank DeepSpeed job with the agent on, then summarize and analyze its trace.

The job is the test workload `tests/workloads/gpt_ds.py` (a small GPT, ZeRO-2, fp16 with one forced
overflow) launched with torchrun on CPU/gloo; it ships with the source checkout, so the demo needs
diag installed from it (`make demo` / scripts/setup.sh install it editable).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from diag.errors import FAILURE, DiagError

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = "tests.workloads.gpt_ds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace-dir", help="where to write the trace (default: a new temp folder)")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps to train (default 12)")
    parser.add_argument(
        "--layers-every", type=int, default=4, help="per-layer time and FLOPs every Nth step (default 4)"
    )
    parser.add_argument("--overflow-at", default="3", help="steps that get an inf gradient ('' none)")
    parser.add_argument("--no-analyze", action="store_true", help="skip `diag analyze`")


def workload_args(args: argparse.Namespace, trace_dir: str) -> list[str]:
    return [
        "--zero",
        "2",
        "--dtype",
        "fp16",
        "--steps",
        str(args.steps),
        "--overflow-at",
        args.overflow_at,
        "--layers-every",
        str(args.layers_every),
        "--log-level",
        "info",
        "--diag",
        "--trace-dir",
        trace_dir,
    ]


def _launcher() -> ModuleType:
    """tests.workloads.launch from the source checkout diag was installed from."""
    if not (ROOT / "tests" / "workloads" / "gpt_ds.py").is_file():
        raise DiagError(
            f"the demo workload is not next to this diag ({ROOT}): install diag from "
            "its source checkout with `make setup` (pip install -e)",
            FAILURE,
        )
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tests.workloads.launch")


def train(args: argparse.Namespace, trace_dir: str) -> None:
    launch = _launcher()
    for mod in ("deepspeed", "torch"):
        if importlib.util.find_spec(mod) is None:
            raise DiagError(f"the demo needs {mod}: pip install 'diag[train]'", FAILURE)
    from rich.console import Console

    with Console(stderr=True).status(f"training {WORKLOAD} on 2 CPU ranks (ZeRO-2, fp16) ..."):
        try:
            proc = launch.run(WORKLOAD, workload_args(args, trace_dir), timeout=600)
        except RuntimeError as e:
            raise DiagError(f"the demo job failed: {str(e).splitlines()[0]}", FAILURE) from None
    with open(os.path.join(trace_dir, "job.log"), "w") as f:  # DeepSpeed's log, for `diag analyze`
        f.write(proc.stdout + proc.stderr)


def analyze(trace_dir: str) -> int:
    """Run `diag analyze` on the trace when that command is installed."""
    if importlib.util.find_spec("diag.cli.analyze") is None:
        print("(diag analyze is not available in this build)")
        return 0
    module = importlib.import_module("diag.cli.analyze")
    parser = argparse.ArgumentParser(prog="diag analyze")
    module.add_arguments(parser)
    return int(module.run(parser.parse_args([trace_dir])) or 0)


def run(args: argparse.Namespace) -> int:
    trace_dir = os.path.abspath(args.trace_dir or tempfile.mkdtemp(prefix="diag-demo-"))
    train(args, trace_dir)
    from diag import load
    from diag.cli.demo_summary import print_summary

    print(f"trace: {trace_dir}")
    print_summary(load(trace_dir))
    if args.no_analyze:
        return 0
    print(f"\n$ diag analyze {trace_dir}")
    return analyze(trace_dir)
