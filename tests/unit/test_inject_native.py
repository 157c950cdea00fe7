"""The pending-call injection library (diag/inject/pending.c), built with the real compiler and
loaded into a real child interpreter with dlopen (through ctypes, which releases the GIL around the
call, as a ptrace-stopped thread may not hold it) instead of ptrace: its constructor only queues the
payload, which then runs on the main thread at the next bytecode boundary."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from diag.control import protocol
from diag.inject import native

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

CHILD = r"""
import builtins, ctypes, sys, threading
ran = builtins.diag_test_ran = []
libc = ctypes.CDLL(None)
libc.dlopen.restype = ctypes.c_void_p
assert libc.dlopen(sys.argv[1].encode(), 2)  # RTLD_NOW; ctypes drops the GIL around this call
for _ in range(1000):
    if ran:
        break
print(ran, threading.active_count())
"""


@pytest.fixture(autouse=True)
def private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


def test_library_is_built_once_per_source_and_private():
    first = native.pending_library()
    (built,) = [n for n in os.listdir(protocol.runtime_dir()) if n.endswith(".so")]
    mtime = os.stat(os.path.join(protocol.runtime_dir(), built)).st_mtime_ns
    assert native.pending_library() == first
    path = os.path.join(protocol.runtime_dir(), built)
    assert os.stat(path).st_mtime_ns == mtime and os.stat(path).st_mode & 0o077 == 0


def test_constructor_queues_the_payload_for_the_main_thread(tmp_path):
    code = (
        b"import builtins, threading\n"
        b"builtins.diag_test_ran.append(threading.current_thread() is threading.main_thread())\n"
    )
    lib = tmp_path / "lib.so"
    lib.write_bytes(native.pending_with(code))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(lib)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.split("\n")[0] == "[True] 1", out  # ran once, on the main thread, no thread started


def test_payload_size_is_bounded():
    with pytest.raises(ValueError, match="exceeds"):
        native.pending_with(b"x" * 4096)


def test_no_compiler_is_reported(monkeypatch):
    monkeypatch.setenv("CC", "false")
    with pytest.raises(native.NoCompiler, match="false failed"):
        native.pending_library()


def test_hypno_library_takes_the_code_in_its_placeholder():
    pytest.importorskip("hypno")
    lib = native.hypno_with(b"print(1)")
    assert b"print(1)\0" in lib and native.HYPNO_MAGIC not in lib
