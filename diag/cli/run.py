"""Run a command with the diag agent preloaded in every rank (no ptrace needed): diag run -- CMD...

A sitecustomize directory is put first on PYTHONPATH; it starts the agent (and its control socket,
so `diag status/detach/stacks` work as after attach) in each torchrun / deepspeed worker, or in the
command itself when it is a plain `python train.py`, never in the launcher. Where the job's own
sitecustomize comes first (its launch script prepends its directory), the `diag-run.pth` that an
installed diag keeps in site-packages boots the agent right after the job's sitecustomize.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from diag.cli import agent_options
from diag.errors import USAGE, DiagError
from diag.inject.payload import ROOT

SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "inject", "site")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    agent_options.add_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")


def environment(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    """The job's environment: our sitecustomize first, diag importable last, options in DIAG_RUN."""
    opts = agent_options.build(args)
    paths = [SITE_DIR, *[p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p], ROOT]
    return {
        **base,
        "PYTHONPATH": os.pathsep.join(paths),
        "DIAG_RUN": opts.to_json(),
        "DIAG_RUN_PID": str(os.getpid()),
    }


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise DiagError("no command given: diag run [options] -- COMMAND ...", USAGE)
    agent_options.build(args)  # a bad option fails here, not in every rank
    if shutil.which(command[0]) is None:
        raise DiagError(f"{command[0]}: command not found", USAGE)
    if note := agent_options.earlier_capture_note("run", os.path.abspath(args.trace_dir)):
        print(note, file=sys.stderr, flush=True)
    os.execvpe(command[0], command, environment(args, dict(os.environ)))  # never returns
