"""The agent options `diag run` and `diag attach` share: where to write, which collectors, how often
to sample. Defaults and checks are `AgentOptions`'s; the options reach `diag.agent.start` in the job
as its JSON (through DIAG_RUN or the injected options file)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from diag.agent.options import DEFAULTS, TRACE_DIR_NAME, AgentOptions
from diag.agent.registry import OptionError
from diag.errors import USAGE, DiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace-dir",
        default=os.path.abspath(TRACE_DIR_NAME),
        help=f"where the ranks write their trace files (default: ./{TRACE_DIR_NAME})",
    )
    parser.add_argument(
        "--what",
        default=",".join(DEFAULTS.what),
        help=f"collectors, comma-separated (default: {','.join(DEFAULTS.what)})",
    )
    parser.add_argument(
        "--layers-every",
        type=int,
        default=None,
        help=f"per-layer time and FLOPs on every Nth step (default {DEFAULTS.layers_every})",
    )
    parser.add_argument(
        "--flops-every",
        type=int,
        default=None,
        help="count FLOPs on 1 sampled step in N of the same input shapes, reuse them on "
        f"the others (default {DEFAULTS.flops_every}; 1 = count on every sampled step)",
    )
    parser.add_argument(
        "--self-time",
        action="store_true",
        help="add up the time spent in diag's hooks (shown by `diag status`)",
    )


def build(args: argparse.Namespace) -> AgentOptions:
    """The checked options; a bad one is a one-line usage error naming its flag."""
    given = {
        "trace_dir": os.path.abspath(args.trace_dir),
        "what": args.what,
        "layers_every": args.layers_every,
        "flops_every": args.flops_every,
        "self_time": args.self_time or None,
    }
    try:
        return AgentOptions.from_mapping(given)
    except OptionError as exc:
        flag = f"--{exc.key.replace('_', '-')} " if exc.key else ""
        raise DiagError(f"{flag}{exc.problem}", USAGE) from None


def earlier_capture_note(command: str, trace_dir: str) -> str | None:
    """The note for a trace directory that already holds rank files: this capture's go beside them
    (`writer.open_private`'s rank-N.K.jsonl), which `diag analyze` reads as a run of its own and
    `diag.load` refuses without `capture=K`. Said when it happens, not found out later."""
    from diag.trace.reader import capture_numbers

    held = capture_numbers(trace_dir)
    if not held:
        return None
    what, them = ("a capture", "it") if len(held) == 1 else (f"{len(held)} captures", "them")
    return (
        f"diag {command}: note: {trace_dir} already holds {what}; this one is written beside {them} as "
        f"rank-N.{held[-1] + 1}.jsonl (read them apart with `diag analyze --each-run`)"
    )


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The checked options as the JSON-ready dict the job receives."""
    return build(args).to_mapping()
