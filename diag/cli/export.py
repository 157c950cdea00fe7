"""Export a diag trace to another format: a Perfetto / Chrome JSON timeline (--perfetto OUT.json).

Each rank is a process with tracks for steps, layers and collectives, plus a device-memory counter.
Files that cannot be read (one line each on stderr, exit code 2) are left out; the others are exported.
"""

from __future__ import annotations

import argparse
import json

from diag.errors import DiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dir", metavar="TRACE_DIR", help="a diag trace directory")
    parser.add_argument("--perfetto", metavar="OUT.json", required=True,
                        help="write a Chrome/Perfetto trace-event JSON file")


def run(args: argparse.Namespace) -> int:
    import sys

    import diag
    from diag.report.perfetto import timeline
    from diag.trace.reader import Unreadable

    try:
        trace = diag.load(args.trace_dir)
    except Unreadable as e:  # nothing readable: one line per bad file
        for p in e.per_file():
            print(f"diag export: error: {p}", file=sys.stderr)
        return e.exit_code
    doc = timeline(trace)
    try:
        with open(args.perfetto, "w", encoding="utf-8") as f:
            json.dump(doc, f, default=str)
    except OSError as e:
        raise DiagError(f"{args.perfetto}: cannot write ({e.strerror or e})") from None
    n = sum(1 for e in doc["traceEvents"] if e["ph"] != "M")
    print(f"wrote {n} events of {len(trace.ranks)} rank(s) to {args.perfetto}")
    for p in trace.problems:  # what could not be read is still exported; say so, exit 2 as analyze
        print(f"diag export: error: {p}", file=sys.stderr)
    return 2 if trace.problems else 0
