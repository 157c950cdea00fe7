"""The agent options `diag run` and `diag attach` share: where to write, which collectors, how often
to sample. Both hand the resulting dict to `diag.agent.start` in the job (through DIAG_RUN or the
injected options file)."""

from __future__ import annotations

import argparse
import os

from diag.agent.runtime import ALL_COLLECTORS
from diag.errors import USAGE, DiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace-dir", default=os.path.abspath("diag-trace"),
                        help="where the ranks write their trace files (default: ./diag-trace)")
    parser.add_argument("--what", default=",".join(ALL_COLLECTORS),
                        help=f"collectors, comma-separated (default: {','.join(ALL_COLLECTORS)})")
    parser.add_argument("--layers-every", type=int, default=None,
                        help="per-layer time and FLOPs on every Nth step (default 50)")
    parser.add_argument("--flops-every", type=int, default=None,
                        help="count FLOPs on 1 sampled step in N of the same input shapes, reuse "
                             "them on the others (default 4; 1 = count on every sampled step)")
    parser.add_argument("--self-time", action="store_true",
                        help="add up the time spent in diag's hooks (shown by `diag status`)")


def options(args: argparse.Namespace) -> dict[str, object]:
    """The options dict, after checking the collector names (a one-line error otherwise)."""
    unknown = [w for w in args.what.split(",") if w.strip() and w.strip() not in ALL_COLLECTORS]
    if unknown:
        raise DiagError(f"unknown collector(s) {', '.join(unknown)}; choose from "
                        f"{', '.join(ALL_COLLECTORS)}", USAGE)
    opts: dict[str, object] = {"trace_dir": os.path.abspath(args.trace_dir), "what": args.what}
    for key in ("layers_every", "flops_every"):
        value = getattr(args, key)
        if value is not None:
            if value < (0 if key == "layers_every" else 1):
                raise DiagError(f"--{key.replace('_', '-')} must be >= "
                                f"{0 if key == 'layers_every' else 1}, got {value}", USAGE)
            opts[key] = value
    if args.self_time:
        opts["self_time"] = True
    return opts
