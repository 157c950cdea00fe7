"""The `diag` command line: one module per subcommand, imported only when that command runs.

Each command module defines `add_arguments(parser)` and `run(args) -> int`; its docstring's first
line is the help text. A `DiagError` raised anywhere becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from diag import __version__
from diag.errors import EXTRAS, DiagError, needs

# name -> module; the order is the order of `diag --help`
COMMANDS = {
    "demo": "diag.cli.demo",
    "run": "diag.cli.run",
    "attach": "diag.cli.attach",
    "detach": "diag.cli.detach",
    "status": "diag.cli.status",
    "stacks": "diag.cli.stacks",
    "top": "diag.cli.top",
    "watch": "diag.cli.watch",
    "analyze": "diag.cli.analyze",
    "diff": "diag.cli.diff",
    "export": "diag.cli.export",
}

# the extra each command needs beyond `pip install diag` (its --help ends with it): a plain install
# ran `diag watch` into "needs pandas" with nothing in its --help to say so (a new user's check)
NEEDS = {
    "attach": "pip install 'diag[attach]'",
    "detach": "pip install 'diag[attach]'",
    "stacks": "pip install 'diag[attach]'",
    "top": "pip install 'diag[tui]'",
    "watch": "pip install 'diag[analyze]'",
    "analyze": "pip install 'diag[analyze]'",
    "diff": "pip install 'diag[analyze]'",
    "export": "pip install 'diag[analyze]' (--prometheus: 'diag[prometheus]')",
}


def _missing(name: str, e: ModuleNotFoundError) -> str:
    """One line for a command whose optional dependency is not installed."""
    return f"diag {name}: error: {needs(e)}"


def _summary(module_name: str) -> str | None:
    """First docstring line of a command module without importing it (keeps --help fast)."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        return None
    import ast

    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diag",
        description="Profile and diagnose DeepSpeed / Megatron training jobs: attach to "
        "a live job, watch it live, analyze traces and logs.",
    )
    parser.add_argument("--version", action="version", version=f"diag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        summary = _summary(module_name)
        if summary is not None:
            sub.add_parser(name, help=summary, add_help=False)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Options may come between a command's paths (`diag analyze TRACE -q LOG`), as users type them
    (plain argparse took LOG for an unknown argument); a command that hands the rest of its line to
    another program (`diag run ... -- CMD`) is parsed plainly: its CMD's options are CMD's."""
    if any(a.nargs in (argparse.REMAINDER, argparse.PARSER) for a in parser._actions):
        return parser.parse_args(argv)
    return parser.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:  # only then: the top parser reads every command's file
        build_parser().parse_args(argv or ["--help"])
        return 2
    name = argv[0]
    try:
        module = importlib.import_module(COMMANDS[name])
    except ModuleNotFoundError as e:
        print(_missing(name, e), file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(
        prog=f"diag {name}",
        description=module.__doc__,
        epilog=f"Needs: {NEEDS[name]}" if name in NEEDS else None,
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    module.add_arguments(parser)
    args = _parse(parser, argv[1:])
    try:
        return int(module.run(args) or 0)
    except DiagError as e:
        print(f"diag {name}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:  # an optional extra the command needs (imports are lazy)
        if (e.name or "").split(".")[0] not in EXTRAS:
            raise
        print(_missing(name, e), file=sys.stderr)
        return 2
