"""Detach diag from a process (or every rank under a launcher): remove all hooks, stop its threads."""

from __future__ import annotations

import argparse

from diag.control.client import request
from diag.errors import FAILURE, DiagError
from diag.procs import rank_targets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=int, help="an attached process, or the launcher above the ranks")


def run(args: argparse.Namespace) -> int:
    errors = []
    # one rank that cannot answer does not keep the others
    for pid, rank in rank_targets(args.pid, "nothing to detach"):
        try:
            reply = request(pid, "detach")
        except DiagError as e:
            errors.append(str(e))
            continue
        who = f"pid {pid}" + (f" (rank {rank})" if rank is not None else "")
        failed = reply.get("undo_failed") or []
        print(f"detached from {who}" + (f"; could not undo: {', '.join(failed)}" if failed else ""))
    if errors:
        raise DiagError("; ".join(errors), FAILURE)
    return 0
