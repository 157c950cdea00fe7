"""No helper process of diag runs code from the working directory or from a file another user can
change (issue 10, critical): attach run by root from a world-writable directory holding a planted
`diag/__init__.py`, `pyinjector.py` and a stdlib-shadowing `ctypes.py` executed them as uid 0,
because the injector children ran `python -S -m diag.inject.raw` / `python -S -c ...`."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

import pytest

from diag.inject import InjectFailed, helper, ptrace
from diag.inject.checks import Target

PLANT = "import os\nopen({marker!r}, 'a').write({name!r} + ' ran as uid %d\\n' % os.getuid())\n"
TARGET = "import sys, time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.005)\n"
PAYLOAD = "open({out!r}, 'w').write('injected')\n"
# (file, module it shadows)
PLANTED = (
    ("diag/__init__.py", "diag"),
    ("diag/inject/__init__.py", "diag.inject"),
    ("diag/inject/raw.py", "diag.inject.raw"),
    ("pyinjector.py", "pyinjector"),
    ("ctypes.py", "ctypes"),
    ("platform.py", "platform"),
    ("sitecustomize.py", "sitecustomize"),
)


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A world-writable working directory full of planted modules, first on our own sys.path too
    (as `python -m diag` would have it); yields the marker file they would write to."""
    cwd = tmp_path / "shared"
    cwd.mkdir()
    os.chmod(cwd, 0o777)
    marker = str(tmp_path / "PWNED")
    for rel, name in PLANTED:
        path = cwd / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PLANT.format(marker=marker, name=name))
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(cwd))  # -I must ignore it
    return marker


@pytest.fixture
def target():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the job is not under test
    proc = subprocess.Popen(
        [sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True, cwd="/", env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield Target(proc.pid, sys.executable, sys.version_info[:2], False)
    proc.kill()
    proc.wait()


def _wait_for(path: str) -> str:
    """The payload's output once written: it opens the file, then writes, so the file may be seen
    empty in between (read "" once while the suite loaded the machine)."""
    deadline = time.monotonic() + 15
    while not os.path.exists(path) or not os.path.getsize(path):
        assert time.monotonic() < deadline, f"the payload never ran ({path})"
        time.sleep(0.02)
    return open(path).read()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="raw.py is x86_64 only")
@pytest.mark.parametrize("method", ["ptrace", "pyinjector"])
def test_injectors_run_nothing_from_a_planted_working_directory(planted, target, tmp_path, method):
    out = str(tmp_path / f"out-{method}")
    fn = ptrace.inject_raw if method == "ptrace" else ptrace.inject_pyinjector
    try:
        fn(target, PAYLOAD.format(out=out))
    except InjectFailed as e:
        assert not os.path.exists(planted), open(planted).read()
        if "not permitted" in str(e):
            pytest.skip(reason=f"ptrace not permitted here: {e}")
        raise
    assert _wait_for(out) == "injected"
    assert not os.path.exists(planted), open(planted).read()


def test_files_other_users_can_change_are_refused(tmp_path):
    own = tmp_path / "mine"
    own.mkdir(mode=0o755)
    script = own / "raw.py"
    script.write_text("pass\n")
    os.chmod(script, 0o644)
    assert helper.untrusted_reason(str(script)) is None
    os.chmod(own, 0o777)  # another user could replace the file
    with pytest.raises(helper.Untrusted, match="writable by other users"):
        helper.script_command(str(script))
    os.chmod(own, 0o1777)  # sticky, like /tmp: entries cannot be replaced by others
    assert helper.untrusted_reason(str(script)) is None
    os.chmod(own, 0o755)
    os.chmod(script, 0o666)
    assert "writable by other users" in (helper.untrusted_reason(str(script)) or "")
    os.chmod(script, 0o644)
    if os.getuid() == 0:
        os.chown(script, 65534, 65534)
        assert "owned by uid 65534" in (helper.untrusted_reason(str(script)) or "")
    link = tmp_path / "link.py"  # judged by what it resolves to
    os.chmod(own, 0o777)
    link.symlink_to(script)
    assert helper.untrusted_reason(str(link)) is not None


def test_a_planted_package_is_skipped_for_the_installed_one(planted, monkeypatch):
    real = helper.package_dir("pyinjector")
    assert real != os.path.realpath(os.getcwd()) and os.path.isdir(os.path.join(real, "pyinjector"))
    monkeypatch.setattr(sys, "path", [os.getcwd()])
    with pytest.raises(helper.Untrusted, match="writable by other users"):
        helper.package_dir("pyinjector")


def test_helpers_are_isolated(planted):
    """The command line itself: -I (no cwd, no PYTHON* variables, no user site) and -S."""
    cmd = helper.script_command(ptrace.RAW, "1")
    assert cmd[1:3] == ["-I", "-S"] and os.path.isabs(cmd[3])
    probe = subprocess.run(
        [sys.executable, *helper.ISOLATED, "-c", "import sys; print(sys.path)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert os.getcwd() not in probe.stdout and "''" not in probe.stdout
