"""Messages that used to mislead (issue 10): each situation is named for what it is, on one line.

A zombie gave "cannot read /proc/PID", a stopped target "has not run Python code for 30 s", a target
under strace "seccomp or a security module?", a private directory pre-created by another user an
`UnsafeDirectory` traceback, `diag status | head` a BrokenPipeError traceback, and one stopped rank
made `diag status` wait 10 s and then skip every rank after it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from diag.errors import DiagError
from diag.inject import checks
from tests.workloads import launch

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(120)\n"
AGENT = """import sys, time
from diag import agent
agent.start(sys.argv[1], 'steps', control=True)
print('ready', flush=True)
time.sleep(120)
"""


def _python(
    code: str, *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _diag(*args: str, env: dict[str, str], **kw) -> subprocess.CompletedProcess[str]:
    return launch.diag_cli(*args, env=env, **kw)


def _state(pid: int, want: str) -> None:
    deadline = time.monotonic() + 10
    while not (checks.status_fields(pid) or {}).get("State", "").startswith(want):
        assert time.monotonic() < deadline, checks.status_fields(pid)
        time.sleep(0.01)


def test_a_zombie_is_named_as_exited():
    child = subprocess.Popen(["true"])  # not reaped until the end: a zombie
    try:
        _state(child.pid, "Z")
        with pytest.raises(DiagError, match=f"pid {child.pid} has exited .*not reaped"):
            checks.inspect(child.pid, need_torch=False)
    finally:
        child.wait()


def test_a_stopped_target_is_named_as_stopped():
    proc = _python(SLEEPER)
    try:
        proc.send_signal(signal.SIGSTOP)
        _state(proc.pid, "T")
        with pytest.raises(DiagError, match=f"pid {proc.pid} is stopped .*kill -CONT {proc.pid}"):
            checks.inspect(proc.pid, need_torch=False)
        proc.send_signal(signal.SIGCONT)
        _state(proc.pid, "S")
        assert checks.inspect(proc.pid, need_torch=False).pid == proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to trace the target")
def test_a_target_under_strace_names_its_tracer():
    proc = _python(SLEEPER, prefix=("strace", "-f", "-o", os.devnull))
    try:
        (py,) = [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and (checks.status_fields(int(p)) or {}).get("PPid") == str(proc.pid)
        ]
        with pytest.raises(DiagError, match=f"pid {py} is already traced by pid {proc.pid} \\(strace\\)"):
            checks.inspect(py, need_torch=False)
    finally:
        proc.kill()
        proc.wait()


def test_a_private_directory_made_by_someone_else_is_one_line(tmp_path):
    (tmp_path / "diag").mkdir(mode=0o755)
    os.chmod(tmp_path / "diag", 0o755)  # not private: as if another user made it for us
    if os.getuid() == 0:
        os.chown(tmp_path / "diag", 65534, 65534)
    res = _diag("status", env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}, capture_output=True)
    assert res.returncode == 1, res
    assert "not a private directory" in res.stderr and "another user may have created it" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr


def test_status_into_a_closed_pipe_is_quiet(tmp_path):
    os.chmod(tmp_path, 0o700)
    r, w = os.pipe()
    os.close(r)  # the reader (`head`) is gone before diag writes
    try:
        res = _diag(
            "status", env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}, stdout=w, stderr=subprocess.PIPE
        )
    finally:
        os.close(w)
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_one_stopped_process_neither_delays_nor_hides_the_others(tmp_path):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg), "OMP_NUM_THREADS": "1"}
    procs = [_python(AGENT, str(tmp_path / f"trace{i}"), env=env) for i in range(2)]
    try:
        stopped, running = sorted(procs, key=lambda p: p.pid)  # listed in pid order: the first stops
        stopped.send_signal(signal.SIGSTOP)
        _state(stopped.pid, "T")
        t0 = time.monotonic()
        res = _diag("status", env=env, capture_output=True)
        took = time.monotonic() - t0
        assert f"pid {running.pid}" in res.stdout, res
        assert f"pid {stopped.pid} is stopped" in res.stderr and res.returncode == 1, res
        assert took < 8, f"status took {took:.1f} s"  # CLI start-up included; was 10 s + the wait
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_stopped_process_is_told_to_detach_and_does_when_resumed(tmp_path):
    """A new user's detach of a SIGSTOPped rank waited 11 s and said "control socket did not answer"
    although the request got through (the rank detached 0.3 s after SIGCONT). Now: at once, one
    line saying it is sent and when it takes effect; resumed, the process detaches."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg), "OMP_NUM_THREADS": "1"}
    proc = _python(AGENT, str(tmp_path / "trace"), env=env)
    try:
        proc.send_signal(signal.SIGSTOP)
        _state(proc.pid, "T")
        t0 = time.monotonic()
        res = _diag("detach", str(proc.pid), env=env, capture_output=True)
        took = time.monotonic() - t0
        assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res
        assert f"pid {proc.pid} is stopped" in res.stderr and "detach is sent" in res.stderr, res.stderr
        assert "error" not in res.stderr  # (not a failure: it is done when the process resumes)
        assert took < 8, f"detach took {took:.1f} s"  # CLI start-up included; was 10 s + the wait
        proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while f"pid {proc.pid}" in _diag("status", env=env, capture_output=True).stdout:
            assert time.monotonic() < deadline, "resumed, the process did not detach"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()


def test_a_target_with_another_runtime_dir_is_refused_before_injecting(tmp_path, monkeypatch):
    """Issue 10: the agent started (socket in the job's XDG_RUNTIME_DIR), attach reported failure
    and status listed nothing. Now attach says where the job keeps its sockets, and injects nothing."""
    from diag.inject.attach import attach_one

    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    for d in (theirs, ours):
        d.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(ours))
    proc = _python(SLEEPER, env={**os.environ, "XDG_RUNTIME_DIR": str(theirs)})
    try:
        with pytest.raises(DiagError, match=f"run diag with XDG_RUNTIME_DIR={theirs}, as the job"):
            attach_one(proc.pid, None, {"trace_dir": str(tmp_path / "t")}, None, False)
        assert not (theirs / "diag").exists() and not list((ours).rglob("attach-*"))
    finally:
        proc.kill()
        proc.wait()
