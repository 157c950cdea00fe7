"""Issue 10's attacks across users: a planted working directory / PYTHONPATH and a private directory
made by someone else, with an unprivileged attacker and root as the victim, and root as the attacker
with an unprivileged victim (every other test here runs as root only). The unprivileged side runs
an interpreter it can read (root's pyenv is not readable by others), found by `_interpreter`."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT
from tests.reliability.test_no_code_from_cwd import PAYLOAD, PLANT, PLANTED, _wait_for
from tests.reliability.test_security import other_user  # noqa: F401 - the useradd fixture

RUNUSER = shutil.which("runuser") or "runuser"  # in /usr/sbin, off the victims' PATH
CASES = ("user_attacks_root", "root_attacks_user")
CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3", os.path.realpath(sys.executable))
# the victim's own command line: isolated (-I), diag from this checkout by explicit path, as the
# `diag` console script has it (`python -m diag` would put the working directory first by itself)
ATTACH = """import sys
sys.path.insert(0, {root!r})
from diag.inject import InjectFailed, ptrace
from diag.inject.checks import Target
try:
    target = Target(int(sys.argv[1]), sys.argv[2], sys.version_info[:2], False)
    warned = ptrace.inject_raw(target, sys.argv[3])
except InjectFailed as e:
    sys.exit(f"failed: {{e}}")
print("injected", warned)
"""
TARGET = "import os, time\nprint(os.getpid(), flush=True)\nwhile True:\n    time.sleep(0.005)\n"
STATUS = "import sys\nsys.path.insert(0, {root!r})\nfrom diag.cli import main\nsys.exit(main(['status']))\n"


def _interpreter(user: str) -> str | None:
    """The first Python >= 3.11 that `user` can run with diag importable from this checkout."""
    for python in CANDIDATES:
        probe = subprocess.run(
            [
                RUNUSER,
                "-u",
                user,
                "--",
                python,
                "-I",
                "-c",
                f"import sys; sys.path.insert(0, {ROOT!r}); import diag.inject.raw; "
                "assert sys.version_info >= (3, 11)",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        if probe.returncode == 0:
            return python
    return None


@pytest.fixture
def user(other_user: str) -> tuple[str, str]:  # noqa: F811
    python = _interpreter(other_user)
    if python is None:
        pytest.skip(
            reason=f"no Python >= 3.11 that user {other_user} can read with diag importable "
            f"(tried {', '.join(CANDIDATES)})"
        )
    return other_user, python


@pytest.fixture
def shared() -> Iterator[str]:
    """A world-writable directory under /tmp (pytest's tmp_path is closed to other users)."""
    path = tempfile.mkdtemp(prefix="diag-shared-")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _as(who: str | None, argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    """Run argv as `who` (None: root, this process)."""
    cmd = argv if who is None else [RUNUSER, "-u", who, "--", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def _private(path: str, owner: str | None) -> str:
    os.makedirs(path, mode=0o700)
    if owner is not None:
        shutil.chown(path, owner, owner)
    return path


@pytest.mark.parametrize("case", CASES)
def test_planted_working_directory_runs_nothing_across_users(user, shared, case):
    name, python = user
    attacker, victim = (name, None) if case == "user_attacks_root" else (None, name)
    work = os.path.join(shared, "work")
    marker = os.path.join(shared, "PWNED")
    files = {os.path.join(work, rel): PLANT.format(marker=marker, name=mod) for rel, mod in PLANTED}
    plant = (
        "import os, sys\nfor path, text in eval(sys.argv[1]).items():\n"
        "    os.makedirs(os.path.dirname(path), exist_ok=True)\n    open(path, 'w').write(text)\n"
        f"os.chmod({work!r}, 0o777)\n"
    )
    made = _as(attacker, [python, "-I", "-c", plant, repr(files)], cwd="/")
    assert made.returncode == 0, made.stderr
    owner = 0 if attacker is None else pwd.getpwnam(attacker).pw_uid
    assert os.stat(os.path.join(work, "pyinjector.py")).st_uid == owner
    xdg = _private(os.path.join(shared, "xdg"), victim)
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": xdg, "PYTHONPATH": work}  # -I must ignore it
    target = subprocess.Popen(
        ([] if victim is None else [RUNUSER, "-u", victim, "--"]) + [python, "-I", "-c", TARGET],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert target.stdout is not None
    pid = int(target.stdout.readline())  # the interpreter's own pid (runuser stays as its parent)
    try:
        out = os.path.join(shared, "out")
        res = _as(
            victim,
            [
                python,
                "-I",
                "-c",
                ATTACH.format(root=ROOT),
                str(pid),
                os.path.realpath(python),
                PAYLOAD.format(out=out),
            ],
            cwd=work,
            env=env,
        )
        assert not os.path.exists(marker), open(marker).read()
        if "not permitted" in res.stdout + res.stderr:
            pytest.skip(reason=f"ptrace not permitted here: {res.stderr.strip()}")
        assert res.returncode == 0 and res.stdout.startswith("injected"), res.stdout + res.stderr
        assert _wait_for(out) == "injected"
        assert not os.path.exists(marker), open(marker).read()
    finally:
        os.kill(pid, signal.SIGKILL)
        target.wait()


@pytest.mark.parametrize("case", CASES)
def test_a_private_directory_made_by_the_other_user_is_one_line(user, shared, case):
    name, python = user
    attacker, victim = (name, None) if case == "user_attacks_root" else (None, name)
    os.chmod(shared, 0o1777)  # a runtime dir anyone can create entries in, like /tmp
    mkdir = f"import os; os.mkdir({os.path.join(shared, 'diag')!r}, 0o755)"
    made = _as(attacker, [python, "-I", "-c", mkdir])
    assert made.returncode == 0, made.stderr
    res = _as(
        victim,
        [python, "-I", "-c", STATUS.format(root=ROOT)],
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": shared},
    )
    assert res.returncode == 1, res
    assert "not a private directory" in res.stderr and "another user may have created it" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
