"""Regenerate analyzers/knob_table.py: the command-line arguments each Megatron flavour really has, and
the ds_config keys of the installed DeepSpeed, from their own parsers and config classes, plus the
version range of every knob that some release lacks.

    git clone https://github.com/microsoft/Megatron-DeepSpeed mds   # or the search tool's bare git dir
    git clone https://github.com/NVIDIA/Megatron-LM mlm
    git clone https://github.com/microsoft/DeepSpeed ds              # only for --versions
    .venv-compat/bin/python scripts/knob_table.py --megatron-deepspeed mds --megatron-lm mlm [--deepspeed ds]
    .venv/bin/python scripts/knob_table.py --ranges-only --megatron-lm mlm --deepspeed ds  # ranges only
    .venv/bin/ruff format analyzers/knob_table.py

Version ranges (`--deepspeed`): every release tag of Megatron-LM (`core_vX.Y.Z`, the megatron.core
version a job imports) and DeepSpeed (`vX.Y.Z`) is read with `git show TAG:file` (no checkout) and
its option strings / ZeRO field names and aliases / top-level config constants collected as written
in the source. Those literals are complete up to megatron.core 0.15; from 0.16 on, Megatron-LM builds
many arguments from config dataclasses, which a literal scan does not see: such a flag counts from the
first tag where its literal appears, else only from the version of the checkout parsed above
(conservative: an older job is not told a flag it might lack). Megatron-DeepSpeed has no releases
after its fork (its tags are Megatron-LM's of 2020-21), so its table has no ranges.

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


_MLM_TAG = re.compile(r"^core_v(\d+\.\d+\.\d+)$")
_DS_TAG = re.compile(r"^v(\d+\.\d+\.\d+)$")
_OPTION = re.compile(r"""['"](--[A-Za-z][\w-]*)['"]""")
_ZERO_FIELD = re.compile(r"^    ([a-z][a-z0-9_]*)\s*:", re.M)
_ALIAS = re.compile(r"""alias\s*=\s*['"](\w+)['"]""")
_OLD_ZERO_KEY = re.compile(
    r"""^(?:ZERO_OPTIMIZATION_\w+|OFFLOAD_OPTIMIZER|OFFLOAD_PARAM)\s*=\s*['"]([a-z][a-z0-9_]*)['"]""", re.M
)
_CONSTANT = re.compile(r"""^[A-Z][A-Z0-9_]*\s*=\s*['"]([a-z][a-z0-9_]*)['"]""", re.M)


def vkey(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def _git_show(git_dir: str, tag: str, path: str) -> str | None:
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{tag}:{path}"], capture_output=True, text=True, check=False
    )
    return out.stdout if out.returncode == 0 else None


def _tags(git_dir: str, pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(tag, version) of every release tag matching `pattern`, oldest version first."""
    out = subprocess.run(["git", f"--git-dir={git_dir}", "tag"], capture_output=True, text=True, check=True)
    found = [(t, m.group(1)) for t in out.stdout.split() if (m := pattern.match(t))]
    return sorted(found, key=lambda tv: vkey(tv[1]))


def _git_dir(path: str) -> str:
    p = Path(path)
    return str(p / ".git") if (p / ".git").exists() else str(p)


def megatron_lm_releases(path: str) -> dict[str, set[str]]:
    """{megatron.core version: option strings written in that release's argument module}."""
    git, out = _git_dir(path), {}
    for tag, version in _tags(git, _MLM_TAG):
        for file in ("megatron/training/arguments.py", "megatron/arguments.py"):
            text = _git_show(git, tag, file)
            if text is not None:
                out[version] = set(_OPTION.findall(text))
                break
    return out


def zero_keys_of(config_py: str | None, *constants_py: str | None) -> set[str]:
    """ZeRO keys a release accepts: its pydantic model's fields and aliases (0.7 on) or its
    ZERO_OPTIMIZATION_* constants (before)."""
    keys: set[str] = set()
    if config_py and "class DeepSpeedZeroConfig" in config_py:
        body = config_py.split("class DeepSpeedZeroConfig", 1)[1]
        body = re.split(r"^(?:class |def )", body, maxsplit=1, flags=re.M)[0]
        keys |= set(_ZERO_FIELD.findall(body)) | set(_ALIAS.findall(body))
    for text in (*constants_py, config_py):
        if text:
            keys |= set(_OLD_ZERO_KEY.findall(text))
    return keys


def deepspeed_releases(path: str) -> dict[str, dict[str, set[str]]]:
    """{version: {"zero_optimization": keys, "top": top-level config constants}} of every release."""
    git, out = _git_dir(path), {}
    for tag, version in _tags(git, _DS_TAG):
        zero = zero_keys_of(
            _git_show(git, tag, "deepspeed/runtime/zero/config.py"),
            _git_show(git, tag, "deepspeed/runtime/zero/constants.py"),
            _git_show(git, tag, "deepspeed/runtime/zero/offload_constants.py"),
        )
        top = _git_show(git, tag, "deepspeed/runtime/constants.py") or ""
        if zero:
            out[version] = {"zero_optimization": zero, "top": set(_CONSTANT.findall(top))}
    return out


def ranges(
    releases: dict[str, set[str]], newest: str, newest_keys: set[str]
) -> tuple[list[str], dict[str, tuple[str, str | None]]]:
    """(versions read, {knob: (first version that has it, last version that has it or None: still in
        `newest`)}) for every knob some read version lacks; knobs in the first and the newest version are
    left out (always there). A knob
        of `newest` not written in any release counts from `newest`; gaps between sightings count as present
        (a knob built from a dataclass is invisible to the literal scan of the releases in between)."""
    versions = sorted({*releases, newest}, key=vkey)
    seen = {**{v: set(k) for v, k in releases.items()}, newest: set(newest_keys)}
    out: dict[str, tuple[str, str | None]] = {}
    for knob in set().union(*seen.values()):
        have = [v for v in versions if knob in seen[v]]
        if have[0] == versions[0] and have[-1] == newest:  # first to last: the same as always there
            continue
        out[knob] = (have[0], None if have[-1] == newest else have[-1])
    return versions, dict(sorted(out.items()))


def installed_top_keys() -> set[str]:
    """Top-level ds_config constants of the installed DeepSpeed (the same scan as the releases')."""
    import deepspeed.runtime.constants as c

    return set(_CONSTANT.findall(Path(c.__file__).read_text()))


def _render_ranges(name: str, versions: list[str], rng: dict[str, tuple[str, str | None]]) -> list[str]:
    lines = [f"    {name!r}: (", f"        {tuple(versions)!r},", "        {"]
    lines += [f"            {k!r}: {v!r}," for k, v in rng.items()]
    return [*lines, "        },", "    ),"]


def render_versions(
    mlm: tuple[list[str], dict[str, tuple[str, str | None]]],
    zero: tuple[list[str], dict[str, tuple[str, str | None]]],
    top: tuple[list[str], dict[str, tuple[str, str | None]]],
) -> str:
    lines = [
        "",
        "# {table: (versions read, {knob: (first version with it, last version with it or None: still in",
        "# the newest)})}, only knobs some read version lacks (scripts/knob_table.py --deepspeed)",
        "RANGES: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, str | None]]]] = {",
    ]
    lines += _render_ranges("megatron-lm", *mlm)
    lines += _render_ranges("zero_optimization", *zero)
    lines += _render_ranges("ds_config", *top)
    return "\n".join([*lines, "}", ""])


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
    ap.add_argument("--deepspeed", help="DeepSpeed checkout or bare git dir: adds version ranges")
    ap.add_argument(
        "--ranges-only",
        action="store_true",
        help="keep the argument tables of --out, redo only the version ranges (give both repositories)",
    )
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--one", nargs=2, metavar=("SRC", "MODULE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if a.one:  # one checkout per interpreter: the two flavours both define the `megatron` package
        print(json.dumps(arguments(*a.one)))
        return 0
    if a.ranges_only:
        return _redo_ranges(a.out, a.megatron_lm, a.deepspeed)
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
    ds = deepspeed_keys()
    text = render(tables, sources, ds)
    if a.deepspeed:
        text += versions_text(a.megatron_lm, a.deepspeed, sources["megatron-lm"]["core_version"], tables, ds)
    Path(a.out).write_text(text)
    return 0


def versions_text(mlm_path: str, ds_path: str, core: str, tables: dict[str, Any], ds: dict[str, Any]) -> str:
    mlm = megatron_lm_releases(mlm_path)
    dsr = deepspeed_releases(ds_path)
    print(f"ranges: {len(mlm)} Megatron-LM and {len(dsr)} DeepSpeed releases", file=sys.stderr)
    return render_versions(
        ranges(mlm, core, set(tables["megatron-lm"])),
        ranges(
            {v: k["zero_optimization"] for v, k in dsr.items()}, ds["version"], set(ds["zero_optimization"])
        ),
        ranges({v: k["top"] for v, k in dsr.items()}, ds["version"], installed_top_keys()),
    )


def _redo_ranges(out: str, mlm_path: str, ds_path: str) -> int:
    """Replace the ranges of an existing table (its argument tables were parsed in the compat venv)."""
    text = Path(out).read_text().split("\n# {table: (versions read", 1)[0].rstrip("\n") + "\n"
    space: dict[str, Any] = {}
    exec(compile(text, out, "exec"), space)  # the generated module: plain literals
    ds = {"version": space["DEEPSPEED_VERSION"], "zero_optimization": space["ZERO_KEYS"]}
    if ds["version"] != deepspeed_keys()["version"]:
        print(f"the table was made with DeepSpeed {ds['version']}: install it first", file=sys.stderr)
        return 1
    core = space["SOURCES"]["megatron-lm"]["core_version"]
    Path(out).write_text(text + versions_text(mlm_path, ds_path, core, space["ARGS"], ds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
