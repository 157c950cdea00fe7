"""Live terminal UI of a training job: step time, ranks, collectives, layers, overflow, GPUs, findings.

  diag top                  follow ./diag-trace (or $DIAG_TRACE_DIR)
  diag top <trace-dir>      follow a trace directory as it grows (also ranks on other nodes
                            over a shared filesystem); one that does not exist yet is waited for
  diag top <pid>            follow a job by a rank's pid or its launcher's (torchrun, deepspeed): an
                            attached rank's control socket, or the trace file an in-process agent
                            holds open, gives the trace directory
  diag top <dir> --replay --speed 10   play a finished trace as if live, 10x faster

A live job's ranks on this host are looked at as `diag watch` looks at them (`diag.live.looks`): the
findings name a rank throttled from outside (stopped and resumed again and again), stopped (a hang)
or dead within seconds, as the watch does. The looks are kept in the trace directory only by
`diag watch` (one writer of proc-<host>.jsonl); `diag top` reads what a watch kept.

The GPU-health sidecar (NVML) samples this host's GPUs into <trace-dir>/gpu-<host>.jsonl while
following a live job; without a GPU the status line says so once.
"""

from __future__ import annotations

import argparse
import os

from diag.errors import USAGE, DiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", help="trace directory or pid (default: ./diag-trace)")
    parser.add_argument("--replay", action="store_true", help="play a finished trace as if live")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="replay speed factor (0 = everything at once; default 1)"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="refresh period, seconds")
    parser.add_argument("--no-gpu", action="store_true", help="do not start the NVML sidecar")
    parser.add_argument("--no-analyze", action="store_true", help="do not run the analyzers live")


def resolve(args: argparse.Namespace) -> tuple[object, str]:
    """The data source for the arguments, and the trace directory it reads."""
    from diag.tui.source import LiveSource, ReplaySource, trace_dir_of_pid

    target = args.target or os.environ.get("DIAG_TRACE_DIR") or "diag-trace"
    if args.speed < 0:
        raise DiagError("--speed must be >= 0", USAGE)
    if args.interval <= 0:
        raise DiagError("--interval must be > 0", USAGE)
    if target.isdigit() and not os.path.isdir(target):
        if args.replay:
            raise DiagError("--replay takes a trace directory, not a pid", USAGE)
        trace_dir = trace_dir_of_pid(int(target))
        return LiveSource(trace_dir, label=f"pid {target} ({trace_dir})"), trace_dir
    if args.replay:
        return ReplaySource(target, args.speed), target
    return LiveSource(target, wait=True), target


def gpu_sidecar(trace_dir: str) -> tuple[object | None, list[str]]:
    """Start the NVML sidecar for this host; without a GPU, the one note the UI shows instead."""
    from diag.nvml.sidecar import Sidecar

    sidecar = Sidecar(trace_dir)
    if sidecar.start():
        return sidecar, []
    return None, [f"no NVIDIA GPU ({sidecar.error})"]


def run(args: argparse.Namespace) -> int:
    try:
        from diag.tui.app import TopApp
        from diag.tui.pump import run_analyzers
    except ImportError as e:
        raise DiagError(f"diag top needs textual: pip install 'diag[tui]' ({e.name} missing)") from None
    source, trace_dir = resolve(args)
    sidecar, notes = None, list[str]()
    if source.live and not args.no_gpu:  # type: ignore[attr-defined]
        sidecar, notes = gpu_sidecar(trace_dir)
    app = TopApp(
        source,
        interval=args.interval,
        notes=tuple(notes),
        sidecar=sidecar,
        analyze=None if args.no_analyze else run_analyzers,
    )
    app.run()
    return 0
