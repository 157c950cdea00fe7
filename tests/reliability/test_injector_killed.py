"""Killing diag's ptrace injector mid-injection leaves the target running and intact (issue 10: a
SIGKILL as soon as the injector was the tracer left the target stopped, state T, 3 times of 3).

raw.py seizes the target (PTRACE_SEIZE: no SIGSTOP, so no group-stop survives the tracer) and blocks
the signals that end a process for the whole injection (SIGTERM, SIGINT, SIGHUP, SIGQUIT: a Ctrl-C
of `diag attach`, or the parent's timeout): those wait until the target's registers are back. What
are SIGKILLs, at any moment: each call it makes in the target returns through libc's rt_sigreturn
trampoline over a frame of the target's own registers, so the kernel, detaching the target from
its dead tracer, lets it finish the call and resume exactly where it was."""

from __future__ import annotations

import os
import platform
import select
import signal
import subprocess
import sys
import time

import pytest

from diag.inject import checks, ptrace

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="raw.py is x86_64 only"),
    pytest.mark.skipif(checks.status_fields(os.getpid()) is None, reason="needs /proc"),
]

TARGET = r"""
import math, select, sys
print('ready', flush=True)
n = 0
while True:  # the main thread mostly sits in select(): the interrupted-syscall path is exercised
    r, _, _ = select.select([sys.stdin], [], [], 0.001)
    junk = [bytearray(1000) for _ in range(10)]
    if math.fsum(i * 0.1 for i in range(100)) != 495.0:  # float registers intact
        print('corrupt', flush=True)
    n += 1
    if r:
        if not sys.stdin.readline():
            break
        print('pong', n, flush=True)
"""


@pytest.fixture
def target():
    proc = subprocess.Popen(
        [sys.executable, "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/"
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def _answers(proc: subprocess.Popen) -> None:
    """Not stopped, not traced, and its main thread still runs Python: it answers a ping."""
    deadline = time.monotonic() + 5
    while (fields := checks.status_fields(proc.pid)) and fields.get("TracerPid") != "0":
        assert time.monotonic() < deadline, f"still traced: {fields}"
        time.sleep(0.005)
    assert fields is not None and proc.poll() is None, f"the target died: {proc.returncode}"
    assert fields["State"][0] not in "Tt", f"the target is left stopped: {fields['State']}"
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("ping\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    assert ready, "the target did not answer within 10 s"
    assert proc.stdout.readline().startswith("pong")


def _injector(pid: int, tmp_path) -> subprocess.Popen:
    payload = tmp_path / "payload.py"
    payload.write_text("pass\n")
    cmd = [sys.executable, "-I", "-S", ptrace.RAW, str(pid), str(payload)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _when_tracing(child: subprocess.Popen, pid: int) -> bool:
    """Wait until `child` traces `pid`; False when it finished first (on a loaded machine the whole
    injection, ~1 ms, can fall between two looks)."""
    deadline = time.monotonic() + 10
    while (checks.status_fields(pid) or {}).get("TracerPid") != str(child.pid):
        if child.poll() is not None:
            assert child.returncode == 0, child.stderr.read() if child.stderr else ""
            return False
        assert time.monotonic() < deadline, "the injector never became the tracer"
    return True


def _hits(target, tmp_path, want: int, act) -> None:
    """Start injectors until `want` of them were acted on (`act(child)`) while tracing."""
    hits = 0
    for _ in range(want * 10):
        child = _injector(target.pid, tmp_path)
        if _when_tracing(child, target.pid):
            act(child)
            hits += 1
        child.wait(timeout=30)
        _answers(target)
        if hits == want:
            return
    pytest.fail(f"only {hits} of {want} injectors were caught tracing")


def test_sigkill_as_soon_as_the_injector_is_the_tracer(target, tmp_path):
    _hits(target, tmp_path, 5, lambda child: child.kill())


def test_sigkill_at_any_moment_of_the_injection(target, tmp_path):
    """Each call in the target returns through rt_sigreturn over a frame of its own registers:
    the injector may die mid-call (this used to leave the target to return to address 0)."""
    for delay in (
        0.0001,
        0.0002,
        0.0003,
        0.0005,
        0.0008,
        0.001,
        0.0015,
        0.002,
        0.003,
        0.005,
        0.008,
        0.012,
        0.02,
    ):

        def act(child: subprocess.Popen, delay: float = delay) -> None:
            time.sleep(delay)
            child.kill()

        _hits(target, tmp_path, 1, act)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_terminating_signals_at_any_moment_wait_for_the_registers(target, tmp_path, sig):
    """A Ctrl-C of `diag attach`, or its timeout's SIGTERM, at any delay: the injection finishes or
    is undone first, the target keeps running."""
    for delay in (0.0, 0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008):

        def act(child: subprocess.Popen, delay: float = delay) -> None:
            time.sleep(delay)
            child.send_signal(sig)

        _hits(target, tmp_path, 1, act)
