"""Regenerate analyzers/knob_table.py: the command-line arguments each Megatron flavour really has, and
the ds_config keys of the installed DeepSpeed, from their own parsers and config classes.

    git clone https://github.com/microsoft/Megatron-DeepSpeed mds   # or the search tool's bare git dir
    git clone https://github.com/NVIDIA/Megatron-LM mlm
    .venv-compat/bin/python scripts/knob_table.py --megatron-deepspeed mds --megatron-lm mlm

Each checkout's argument module is imported from the checkout and its `parse_args()` run until it
would parse (the parser is captured there), so arguments built from config dataclasses
(Megatron-LM's ArgumentGroupFactory) count too. Modules a checkout imports but this environment lacks
(transformers, ...) are replaced by empty stand-ins: argument definitions do not use them.
A bare git dir (no work tree) is read with `git archive`. Needs torch, deepspeed and, for Megatron-LM,
the packages megatron.core imports (the compat venv has them).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "analyzers" / "knob_table.py"
FLAVOURS = {  # name -> (repository, argument module, file)
    "megatron-deepspeed": ("microsoft/Megatron-DeepSpeed", "megatron.arguments", "megatron/arguments.py"),
    "megatron-lm": ("NVIDIA/Megatron-LM", "megatron.training.arguments", "megatron/training/arguments.py"),
}


# imported at module level by Megatron-DeepSpeed's argument module chain (tokenizers), not by its parser
STUBBED = ("transformers", "sentencepiece", "tiktoken", "nltk", "six", "regex")


class _Stub(types.ModuleType):
    """A module this environment lacks: any attribute is another stand-in (a class can derive from it)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: a module of STUBBED that no real finder finds gets a stand-in (only
    these: code that probes optional modules with try/except must see the others missing)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        mod = _Stub(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _checkout(path: str, tmp: str, name: str) -> tuple[str, str]:
    """(source folder, commit) of a work tree or a bare git dir."""
    p = Path(path)
    git = ["git", f"--git-dir={p / '.git'}"] if (p / ".git").exists() else ["git", f"--git-dir={p}"]
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if (p / ".git").exists():
        return str(p), commit
    out = Path(tmp) / name
    out.mkdir(parents=True)
    tar = subprocess.run([*git, "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return str(out), commit


def _core_version(src: str) -> str:
    """megatron.core's version as the checkout states it (package_info.py), "" when it has none."""
    info = Path(src) / "megatron" / "core" / "package_info.py"
    if not info.exists():
        return ""
    got = dict(re.findall(r"^(MAJOR|MINOR|PATCH) = (\d+)", info.read_text(), re.M))
    return ".".join(got[k] for k in ("MAJOR", "MINOR", "PATCH") if k in got)


def arguments(src: str, module: str) -> list[str]:
    """Every option string of the checkout's Megatron parser."""
    sys.path.insert(0, src)
    finder = _StubFinder()
    sys.meta_path.append(finder)
    orig = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args

    def capture(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign,assignment]
    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign,assignment]
    try:
        mod = importlib.import_module(module)
        try:
            mod.parse_args()
        except _Captured as got:
            return sorted({o for a in got.parser._actions for o in a.option_strings if o.startswith("--")})
        raise RuntimeError(f"{module}.parse_args() returned without parsing")
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = orig  # type: ignore[method-assign]
        sys.meta_path.remove(finder)
        sys.path.remove(src)
        for name in [m for m in sys.modules if m.split(".")[0] in ("megatron", "tools")]:
            del sys.modules[name]


def deepspeed_keys() -> dict[str, Any]:
    """The installed DeepSpeed's ZeRO field names and aliases (its pydantic model forbids others)."""
    import deepspeed
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = set()
    for name, f in DeepSpeedZeroConfig.model_fields.items():
        zero.add(name)
        if f.alias:
            zero.add(f.alias)
    return {"version": deepspeed.__version__, "zero_optimization": sorted(zero)}


def render(tables: dict[str, list[str]], sources: dict[str, dict[str, str]], ds: dict[str, Any]) -> str:
    lines = [
        '"""Generated by scripts/knob_table.py from the frameworks\' own argument parsers and config',
        'classes; do not edit by hand (rerun the script on a newer checkout)."""',
        "",
        "SOURCES = {",
    ]
    for name, s in sources.items():
        lines.append(f"    {name!r}: {{")
        lines += [f"        {k!r}: {v!r}," for k, v in s.items()]
        lines.append("    },")
    lines += ["}", "", "ARGS: dict[str, frozenset[str]] = {"]
    for name, args in tables.items():
        lines.append(f"    {name!r}: frozenset({{")
        lines += [f"        {a!r}," for a in args]
        lines.append("    }),")
    lines += ["}", "", f"DEEPSPEED_VERSION = {ds['version']!r}", "ZERO_KEYS: frozenset[str] = frozenset({"]
    lines += [f"    {k!r}," for k in ds["zero_optimization"]]
    lines += ["})", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron-deepspeed", help="checkout or bare git dir")
    ap.add_argument("--megatron-lm", help="checkout or bare git dir")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--one", nargs=2, metavar=("SRC", "MODULE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if a.one:  # one checkout per interpreter: the two flavours both define the `megatron` package
        print(json.dumps(arguments(*a.one)))
        return 0
    tables, sources = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in (("megatron-deepspeed", a.megatron_deepspeed), ("megatron-lm", a.megatron_lm)):
            repo, module, file = FLAVOURS[name]
            src, commit = _checkout(path, tmp, name)
            out = subprocess.run(
                [sys.executable, __file__, "--one", src, module], capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            tables[name] = json.loads(out.stdout.strip().splitlines()[-1])
            sources[name] = {"repo": repo, "commit": commit, "file": file, "core_version": _core_version(src)}
            print(f"{name}: {len(tables[name])} arguments from {repo}@{commit[:12]}", file=sys.stderr)
    Path(a.out).write_text(render(tables, sources, deepspeed_keys()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
