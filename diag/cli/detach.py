"""Detach diag from a process (or every rank under a launcher): remove all hooks, stop its threads."""

from __future__ import annotations

import argparse
import sys

from diag.control.client import request, send
from diag.errors import FAILURE, DiagError
from diag.inject.checks import stopped_state
from diag.procs import rank_targets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=int, help="an attached process, or the launcher above the ranks")


def run(args: argparse.Namespace) -> int:
    errors, pending = [], []  # pending: not an error, not done yet (exit 1 all the same)
    # one rank that cannot answer does not keep the others
    for pid, rank in rank_targets(args.pid, "nothing to detach"):
        who = f"pid {pid}" + (f" (rank {rank})" if rank is not None else "")
        try:
            state = stopped_state(pid)
            if state:  # it cannot answer now: the request waits in its socket, done when resumed
                send(pid, "detach")
                pending.append(
                    f"{who} is stopped ({state}): its detach is sent and takes effect when it resumes "
                    f"(`kill -CONT {pid}`; `diag status` then no longer lists it)"
                )
                continue
            reply = request(pid, "detach")
        except DiagError as e:
            errors.append(str(e))
            continue
        failed = reply.get("undo_failed") or []
        print(f"detached from {who}" + (f"; could not undo: {', '.join(failed)}" if failed else ""))
    for line in pending:
        print(f"diag detach: {line}", file=sys.stderr)
    if errors:
        raise DiagError("; ".join(errors), FAILURE)
    return FAILURE if pending else 0
