"""A command whose optional extra is not installed says which in one line (exit 2), never a traceback:
`pip install diag` alone has no pandas, and `diag analyze` / `diag watch` imported it lazily, so a user
got ModuleNotFoundError's traceback (seen on a fresh install from the wheel)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.workloads.launch import ROOT

# sys.modules[name] = None makes `import name` raise ModuleNotFoundError, as if it were not installed
CODE = "import sys; sys.modules[{mod!r}] = None; from diag.cli import main; sys.exit(main({argv!r}))"
SAMPLE = f"{ROOT}/sample_traces/healthy"


@pytest.mark.parametrize(
    ("mod", "argv", "extra"),
    [
        ("pandas", ["analyze", SAMPLE], "analyze"),
        ("pandas", ["watch", SAMPLE, "--json", "--duration", "1"], "analyze"),
        ("prometheus_client", ["export", "--prometheus", "127.0.0.1:0", SAMPLE], "prometheus"),
        ("psutil", ["attach", "1"], "attach"),
        ("psutil", ["detach", "1"], "attach"),
    ],
)
def test_missing_extra_is_one_line(mod: str, argv: list[str], extra: str) -> None:
    res = subprocess.run(
        [sys.executable, "-c", CODE.format(mod=mod, argv=argv)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'diag[{extra}]'" in lines[0] and mod in lines[0], lines


@pytest.mark.parametrize("command", ["attach", "detach", "stacks", "status"])
def test_help_needs_no_extra(command: str) -> None:
    """`diag attach --help` on a fresh `pip install diag` (no psutil: the attach extra) printed the
    missing-extra line instead of the options that say which extra to install (a new user's first
    look, seen from the wheel)."""
    res = subprocess.run(
        [sys.executable, "-c", CODE.format(mod="psutil", argv=[command, "--help"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: diag {command}"), res.stdout[:200]


@pytest.mark.parametrize(
    ("command", "extra"), [("watch", "analyze"), ("analyze", "analyze"), ("top", "tui"), ("attach", "attach")]
)
def test_help_says_which_extra_the_command_needs(command: str, extra: str) -> None:
    """A plain `pip install diag` ran `diag watch` into "needs pandas" with nothing in its --help to
    say so (a new user of the wheel, session 29): the help ends with the extra, and prints without it."""
    mod = {"analyze": "pandas", "tui": "textual", "attach": "psutil"}[extra]
    res = subprocess.run(
        [sys.executable, "-c", CODE.format(mod=mod, argv=[command, "--help"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.rstrip().endswith(f"Needs: pip install 'diag[{extra}]'"), res.stdout[-300:]


def test_load_without_pandas_says_which_extra() -> None:
    """`diag.load` from a plain `pip install diag` raised pandas' bare ModuleNotFoundError (a new
    user of the wheel, session 28): the error says which extra to install, and is still one that
    `except ImportError` catches."""
    code = (
        "import sys; sys.modules['pandas'] = None; import diag\n"
        "try:\n    diag.load(sys.argv[1])\n"
        "except ImportError as e:\n    print(type(e).__name__, e.name, e)"
    )
    res = subprocess.run([sys.executable, "-c", code, SAMPLE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    said = "diag.load needs pandas, which is not installed: pip install 'diag[analyze]'"
    assert res.stdout.strip() == f"ModuleNotFoundError pandas {said}", res.stdout
