"""Attach the diag agent to a running Python training job (a rank, or a torchrun/deepspeed launcher).

Tries sys.remote_exec (Python 3.14+ targets), then diag's own ptrace injector: neither makes the
stopped thread call malloc. pyinjector, hypno and gdb (which do, and can deadlock a rank stopped in
malloc) run only when named with --method, with a warning. Each queues the payload for the main
thread's next safe point.
Given a launcher pid, attaches to every local rank under it, in parallel (each injection is a child
process with a timeout, so one stuck rank cannot hang the command). The agent writes
<trace-dir>/rank-NNNNN.jsonl and answers `diag status` / `diag detach` on a private socket.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from diag.cli import agent_options
from diag.errors import FAILURE, DiagError
from diag.inject import METHODS
from diag.inject.attach import Attached, attach_one
from diag.procs import rank_targets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=int, help="a rank's pid, or the torchrun/deepspeed launcher's")
    agent_options.add_arguments(parser)
    parser.add_argument(
        "--duration", type=float, default=None, help="detach after this many seconds (default: stay attached)"
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default=None,
        help="force one injection method (default: remote_exec, then ptrace)",
    )
    parser.add_argument(
        "--no-torch", action="store_true", help="attach even if the target has not imported torch"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say each method tried, why it failed, which one worked and its latency",
    )


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    options = agent_options.options(args)
    ranks = rank_targets(args.pid, "attach again once its ranks run, or to a rank's pid")
    note = agent_options.earlier_capture_note("attach", options["trace_dir"])  # before this one's files
    with ThreadPoolExecutor(max_workers=min(16, len(ranks))) as pool:
        futures = [
            pool.submit(attach_one, pid, rank, options, args.method, not args.no_torch) for pid, rank in ranks
        ]
    results, failed = [], []
    for fut in futures:
        try:
            results.append(fut.result())
        except DiagError as e:
            failed.append(str(e))
    for res in results:
        if args.verbose:
            for why in res.tried:
                print(f"pid {res.pid}: method {why.replace(': ', ' failed or skipped: ', 1)}")
        print(_line(res, args.verbose, time.perf_counter() - t0))
        if res.warning:
            print(f"diag: warning: pid {res.pid}: {res.warning}", file=sys.stderr)
    if results:  # the trace line only where something writes there (never before a failure alone)
        print(f"trace: {options['trace_dir']}")
        if note and not all(res.reused for res in results):  # (a running agent keeps its file)
            print(note, file=sys.stderr)
    if failed:
        raise DiagError("; ".join(failed), FAILURE)
    if args.duration is not None:
        _detach_after(results, args.duration)
    return 0


def _line(res: Attached, verbose: bool, total: float) -> str:
    who = f"pid {res.pid}" + (f" (rank {res.rank})" if res.rank is not None else "")
    if res.reused:
        return f"{who}: already attached, reusing the running agent"
    detail = f" via {res.method}: injected in {res.inject_s:.3f} s, agent ready at {total:.2f} s"
    return f"attached to {who}" + (detail if verbose else "")


def _detach_after(results: list[Attached], seconds: float) -> None:
    from diag.control.client import request

    try:
        time.sleep(seconds)
    finally:
        for res in results:
            request(res.pid, "detach")
            print(f"detached from pid {res.pid}")
