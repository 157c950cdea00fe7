"""List attached processes and, per collector, the events captured / dropped / failed so far."""

from __future__ import annotations

import argparse
import json
from typing import Any

from diag.control.client import attached_pids, request


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=int, nargs="?", help="one attached process (default: all)")
    parser.add_argument("--json", action="store_true", help="one JSON object per process")


def run(args: argparse.Namespace) -> int:
    pids = [args.pid] if args.pid is not None else attached_pids()
    if not pids:
        print("no attached processes")
        return 0
    for pid in pids:
        st = request(pid, "status")
        print(json.dumps(st, default=str) if args.json else render(st))
    return 0


def render(st: dict[str, Any]) -> str:
    """A few lines per process: who, where it writes, then one line per collector."""
    rank = f" rank {st['rank']}" if st.get("rank") is not None else ""
    lines = [f"pid {st['pid']}{rank}: step {st['step']}, layers every {st['layers_every']}, "
             f"{st['buffered']} buffered, trace {st['trace_file']}"]
    kinds = sorted(set(st["captured"]) | set(st["dropped"]) | set(st["errors"]) | set(st["collectors"]))
    for kind in kinds:
        lines.append(f"  {kind:<10} captured {st['captured'].get(kind, 0):>8}  "
                     f"dropped {st['dropped'].get(kind, 0):>6}  failed {st['errors'].get(kind, 0):>4}")
    for name, why in st.get("install_failures", {}).items():
        lines.append(f"  {name:<10} not installed: {why}")
    own = f"  agent's own time: writer thread {st.get('writer_cpu_ns', 0) / 1e6:.1f} ms CPU"
    if st.get("hook_ns") is not None:
        own += f", hooks {st['hook_ns'] / 1e6:.1f} ms"
    lines.append(own)
    if st.get("lines_lost") or st.get("write_error"):
        lines.append(f"  trace file: {st['lines_lost']} lines lost ({st['write_error']})")
    return "\n".join(lines)
