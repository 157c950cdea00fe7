"""Injection with ptrace but without gdb: diag's own injector (raw.py), or pyinjector's dlopen.

`ptrace` (default) runs raw.py: the stopped main thread only calls mmap and Py_AddPendingCall.
`pyinjector` loads diag's pending-call library (pending.c): the hijacked thread only
queues the payload with Py_AddPendingCall, and the main thread runs it at its next bytecode
boundary with the GIL held. Without a C compiler it falls back, with a warning, to hypno's library,
which takes the GIL from the hijacked thread: that can deadlock the rank if the thread was stopped
inside the GIL's handoff (seen after 3 to 39 attaches to a 2-rank DeepSpeed job). `hypno` forces that
GIL path. Both pyinjector paths make the stopped thread dlopen(), which mallocs: a thread stopped
inside malloc deadlocks there (measured, see raw.py), hence `ptrace` first. Every injector runs in
a child process with a timeout (pyinjector holds its caller's GIL while it works): ranks are
injected in parallel and a stuck injection cannot hang `diag attach`.
"""

from __future__ import annotations

import os
import subprocess
import sys

from diag.control import protocol
from diag.inject import InjectFailed, native
from diag.inject.checks import Target, ptrace_hint

TIMEOUT_S = 20.0
GIL_RISK = ("takes the GIL from the ptrace-stopped thread, which can deadlock the rank if it was "
            "stopped inside the interpreter's GIL handoff")
RUNNER = """import sys
try:
    import pyinjector
except ImportError:
    sys.exit('the pyinjector package is not installed (pip install diag[attach])')
try:
    pyinjector.inject(int(sys.argv[1]), sys.argv[2], uninject=True)
except Exception as e:
    sys.exit(type(e).__name__ + ': ' + (str(e).splitlines() or [''])[0])
"""


def inject_raw(target: Target, code: str) -> str | None:
    """diag's own ptrace injector (raw.py): no dlopen, no malloc in the stopped thread."""
    path = protocol.write_private(f"inject-{target.pid}-{os.urandom(8).hex()}.py", code.encode())
    try:
        _child(["-m", "diag.inject.raw", str(target.pid), path], "the ptrace injector")
    finally:
        os.unlink(path)
    return None


def inject_pyinjector(target: Target, code: str) -> str | None:
    """Queue `code` as a pending call; returns a warning when it had to use the GIL library."""
    try:
        lib = native.pending_with(code.encode())
    except native.NoCompiler as e:
        _run(target.pid, _hypno_lib(code))
        return f"{e}: used hypno's library instead, which {GIL_RISK}"
    except ValueError as e:
        raise InjectFailed(str(e)) from None
    _run(target.pid, lib)
    return None


def inject_hypno(target: Target, code: str) -> str | None:
    _run(target.pid, _hypno_lib(code))
    return f"--method hypno {GIL_RISK}"


def _hypno_lib(code: str) -> bytes:
    try:
        return native.hypno_with(code.encode())
    except (FileNotFoundError, ValueError) as e:
        raise InjectFailed(str(e)) from None


def _run(pid: int, lib: bytes) -> None:
    """Inject `lib` from a private 0600 copy (never /tmp), in a child process with a timeout."""
    path = protocol.write_private(f"inject-{pid}-{os.urandom(8).hex()}.so", lib)
    try:
        _child(["-c", RUNNER, str(pid), path], "pyinjector")
    finally:
        os.unlink(path)


def _child(args: list[str], what: str) -> None:
    """Run an injector in a child interpreter (this one: the raw injector needs its libpython)."""
    try:
        proc = subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    except subprocess.TimeoutExpired:
        raise InjectFailed(f"{what} did not return within {TIMEOUT_S:.0f} s (killed; the target "
                           "may be left stopped: check it with `diag stacks`)") from None
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        if "PermissionError" in err or "ermission" in err or "not permitted" in err:
            raise InjectFailed(f"ptrace not permitted: {ptrace_hint()}")
        raise InjectFailed(err[:300])
