"""List attached processes and, per collector, the events captured / dropped / failed so far.

Every process is asked at once, each with a short deadline, and one that cannot answer (stopped,
gone, hung) is reported on its own line without holding up or hiding the others."""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from diag.control.client import attached_pids, request
from diag.errors import FAILURE, DiagError
from diag.inject.attach import sweep_expired
from diag.inject.checks import stopped_state

TIMEOUT_S = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pid", type=int, nargs="?", help="an attached rank, or the launcher above the ranks (default: all)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per process")


def run(args: argparse.Namespace) -> int:
    sweep_expired()  # payload files of attaches whose payload never ran (past their life)
    # a launcher's pid (torchrun, deepspeed) stands for its ranks, as in attach / detach / stacks
    pids = _ranks(args.pid) if args.pid is not None else attached_pids()
    answers: list[tuple[dict[str, Any] | None, str | None]] = []
    if pids:
        with ThreadPoolExecutor(max_workers=min(16, len(pids))) as pool:
            answers = list(pool.map(_ask, pids))
    errors = [err for _, err in answers if err is not None]
    if args.pid is not None and errors and len(errors) == len(pids):
        raise DiagError(errors[0] if len(errors) == 1 else "; ".join(errors), FAILURE)
    try:
        if not pids:
            print("no attached processes")
        for st, err in answers:
            if st is not None:
                print(json.dumps(st, default=str) if args.json else render(st))
            else:
                print(f"diag status: {err}", file=sys.stderr)
        sys.stdout.flush()
    except BrokenPipeError:  # `diag status | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return FAILURE if errors else 0


def _ranks(pid: int) -> list[int]:
    """The rank processes under `pid` (itself when it is a rank). psutil only here: a bare `status`
    runs on the interpreter's stdlib alone (tests/reliability runs it as another user, isolated)."""
    try:
        from diag.procs import ranks_under
    except ImportError:  # no psutil: the pid as given
        return [pid]
    return [p for p, _ in ranks_under(pid)]


def _ask(pid: int) -> tuple[dict[str, Any] | None, str | None]:
    """(reply, None) or (None, why not): a stopped process is named at once, not waited for."""
    state = stopped_state(pid)
    if state:
        return None, f"pid {pid} is stopped ({state}): it cannot answer until resumed (`kill -CONT {pid}`)"
    try:
        return request(pid, "status", timeout=TIMEOUT_S), None
    except DiagError as e:
        return None, str(e)


def render(st: dict[str, Any]) -> str:
    """A few lines per process: who, where it writes, then one line per collector."""
    rank = f" rank {st['rank']}" if st.get("rank") is not None else ""
    lines = [
        f"pid {st['pid']}{rank}: at the job's step {st['step']}, layers every {st['layers_every']}, "
        f"{st['buffered']} buffered, trace {st['trace_file']}"
    ]
    kinds = sorted(set(st["captured"]) | set(st["dropped"]) | set(st["errors"]) | set(st["collectors"]))
    if kinds:  # this attach's records: "step 2031" beside "step captured 12" read as a contradiction
        lines.append("  records since the attach, per collector:")
    for kind in kinds:
        lines.append(
            f"  {kind:<10} captured {st['captured'].get(kind, 0):>8}  "
            f"dropped {st['dropped'].get(kind, 0):>6}  failed {st['errors'].get(kind, 0):>4}"
        )
    for name, why in st.get("install_failures", {}).items():
        lines.append(f"  {name:<10} not installed: {why}")
    own = f"  agent's own time: writer thread {st.get('writer_cpu_ns', 0) / 1e6:.1f} ms CPU"
    if st.get("hook_ns") is not None:
        own += f", hooks {st['hook_ns'] / 1e6:.1f} ms"
    lines.append(own)
    if st.get("lines_lost") or st.get("write_error"):
        lines.append(f"  trace file: {st['lines_lost']} lines lost ({st['write_error']})")
    return "\n".join(lines)
