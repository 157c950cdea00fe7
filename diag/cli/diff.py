"""Compare two runs (baseline, candidate): step time, throughput and where the time went.

Each side is one run: a diag trace folder, Kineto trace files/folders or a training log (several
inputs of one run: give the baseline's with the first PATHs and the candidate's after --vs).
The waterfall splits the change in mean time per step (or per sample/token when the batch differs)
into compute, exposed communication by collective kind and role, idle/input wait, optimizer step,
overflow-skipped steps and other host time; the parts sum exactly to the total. See docs/diff.md.
"""

from __future__ import annotations

import argparse
import json

from diag.cli.output import write_report
from diag.errors import DiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="BASELINE CANDIDATE, or the baseline's inputs followed by --vs",
    )
    parser.add_argument("--vs", nargs="+", metavar="PATH", help="the candidate's inputs")
    parser.add_argument(
        "--per",
        choices=("auto", "step", "sample", "token"),
        default="auto",
        help="unit of the waterfall (auto: per step unless the batch differs)",
    )
    parser.add_argument("--json", action="store_true", help="print the diff as JSON (schema diag.diff v1)")
    parser.add_argument("--markdown", metavar="FILE", help="also write a Markdown report")
    parser.add_argument("--html", metavar="FILE", help="also write an HTML report")


def sides(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    if args.vs:
        return list(args.paths), list(args.vs)
    if len(args.paths) != 2:
        raise DiagError(
            f"expected BASELINE CANDIDATE, got {len(args.paths)} path(s) (several inputs per "
            "side: BASELINE... --vs CANDIDATE...)"
        )
    return [args.paths[0]], [args.paths[1]]


def run(args: argparse.Namespace) -> int:
    from diag.diff import model, render
    from diag.diff.sides import load_side

    base, cand = sides(args)
    doc = model.build(load_side("baseline", base), load_side("candidate", cand), args.per)
    if args.markdown:
        write_report(args.markdown, render.markdown(doc))
    if args.html:
        write_report(args.html, render.to_html(doc))
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        from rich.console import Console

        render.terminal(doc, Console())
    return 0
