"""diag's own ptrace injector (diag/inject/raw.py) against a real child interpreter whose main thread
mallocs all the time (where dlopen-based injectors deadlock once in ~65 tries): every injection must
return, and every payload must run exactly once, on the main thread."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from diag.inject import raw

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="raw.py is x86_64 only")

TARGET = r"""
import threading, time
def other():  # a second Python thread: the GIL changes hands all the time
    while True:
        sum(range(100)); time.sleep(0.0005)
threading.Thread(target=other, daemon=True).start()
print('ready', flush=True)
while True:
    junk = [bytearray(4000) for _ in range(50)]  # > 512 bytes: real malloc/free
"""
PAYLOAD = (
    "import threading\nopen({out!r},'a').write('m' if threading.current_thread() is "
    "threading.main_thread() else 'x')\n"
)


def test_twenty_injections_each_run_once_on_the_main_thread(tmp_path, capfd):
    out = str(tmp_path / "ran")
    child = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        try:
            for _ in range(20):
                raw.inject(child.pid, PAYLOAD.format(out=out).encode())
        except OSError as e:
            if "not permitted" in str(e):
                pytest.skip(reason=f"ptrace not permitted here: {e}")
            raise
        for _ in range(500):
            if os.path.exists(out) and len(open(out).read()) == 20:
                break
            __import__("time").sleep(0.01)
        assert open(out).read() == "m" * 20
        assert child.poll() is None
        assert "warning" not in capfd.readouterr().err  # the trampoline restored every register
    finally:
        child.kill()
        child.wait()


def test_a_target_that_does_not_map_our_libraries_is_refused():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(LookupError, match="does not map"):
            raw.target_address(sleeper.pid, raw.ctypes.pythonapi.Py_AddPendingCall)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_failed_injection_is_one_line_from_the_child(tmp_path, monkeypatch):
    """ptrace.py runs raw.py in a child process (with a timeout) and reports its last line."""
    from diag.inject import InjectFailed, ptrace
    from diag.inject.checks import Target

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(InjectFailed) as err:
        ptrace.inject_raw(Target(dead.pid, sys.executable, sys.version_info[:2], False), "pass")
    assert "\n" not in str(err.value)
    assert not [n for n in os.listdir(tmp_path / "diag") if f"-{dead.pid}-" in n]  # payload removed


def test_injector_started_with_sigint_ignored_finds_the_restorer():
    """A background job of a non-interactive shell starts with SIGINT ignored, so Python installs no
    SIGINT handler to read libc's restorer from (`diag attach ... &` failed with "cannot find libc's
    signal restorer"). The injector then reads it from a handler of its own, and leaves SIGUSR2 as
    it found it."""
    import signal

    probe = (
        "import signal, ctypes; from diag.inject import raw\n"
        "assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN\n"
        "a = raw.restorer()\n"
        "assert ctypes.string_at(a, len(raw.RESTORE_RT)) == raw.RESTORE_RT\n"
        "assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_xstate_compare_ignores_only_the_init_state_header():
    """A restored thread whose AVX state went back to init reads XSTATE_BV 2 where it was saved with
    6 (1 injection in 10 here): the same state. Any other byte differing is a real difference."""
    saved = bytearray(832)
    saved[512], saved[600] = 6, 0
    now = bytearray(saved)
    now[512] = 2
    assert raw.same_xstate(bytes(saved), bytes(now))
    now[600] = 1
    assert not raw.same_xstate(bytes(saved), bytes(now))
    assert not raw.same_xstate(bytes(saved), bytes(saved[:-1]))


def test_the_signal_frame_leaves_out_amx_tile_data_the_thread_does_not_use():
    """A frame declaring more XSAVE state than the thread has is taken by rt_sigreturn for a legacy
    one (x87/SSE only: the AVX-512 registers were lost and put back by hand on an AMX host)."""
    import struct

    def xstate(xcr0: int, in_use: int, size: int = 11008) -> bytes:
        buf = bytearray(size)
        struct.pack_into("<Q", buf, raw.FX_SW_OFFSET, xcr0)
        struct.pack_into("<Q", buf, raw.XSTATE_BV.start, in_use)
        return bytes(buf)

    amx = (1 << 17) | (1 << raw.TILEDATA)
    assert raw.frame_features(xstate(0x2E7 | amx, 0xA2)) == (0x2E7 | 1 << 17, 11008 - 8192)
    assert raw.frame_features(xstate(0x2E7 | amx, 0xA2 | amx)) == (0x2E7 | amx, 11008)  # tiles in use
    assert raw.frame_features(xstate(0x2E7, 0xA2, 2696)) == (0x2E7, 2696)  # no AMX on this CPU
