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
from diag.inject import helper, native
from diag.inject.checks import Target, describe_state, ptrace_hint
from diag.inject.failure import InjectFailed

TIMEOUT_S = 20.0
GRACE_S = 3.0
RAW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raw.py")
GIL_RISK = (
    "takes the GIL from the ptrace-stopped thread, which can deadlock the rank if it was "
    "stopped inside the interpreter's GIL handoff"
)
RUNNER = """import sys
sys.path.append(sys.argv[3])
import pyinjector
try:
    pyinjector.inject(int(sys.argv[1]), sys.argv[2], uninject=True)
except Exception as e:
    sys.exit(type(e).__name__ + ': ' + (str(e).splitlines() or [''])[0])
"""


def inject_raw(target: Target, code: str) -> str | None:
    """diag's own ptrace injector (raw.py): no dlopen, no malloc in the stopped thread."""
    try:
        cmd = helper.script_command(RAW, str(target.pid))
    except helper.Untrusted as e:
        raise InjectFailed(str(e)) from None
    path = protocol.write_private(f"inject-{target.pid}-{os.urandom(8).hex()}.py", code.encode())
    try:
        stderr = _child([*cmd, path], "the ptrace injector", target.pid)
    finally:
        os.unlink(path)
    warnings = [ln.removeprefix("warning: ") for ln in stderr.splitlines() if ln.startswith("warning: ")]
    return "; ".join(warnings) or None


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
    try:
        where = helper.package_dir("pyinjector")
    except helper.Untrusted as e:
        raise InjectFailed(f"{e} (pip install diag[attach])") from None
    path = protocol.write_private(f"inject-{pid}-{os.urandom(8).hex()}.so", lib)
    try:
        _child([sys.executable, *helper.ISOLATED, "-c", RUNNER, str(pid), path, where], "pyinjector", pid)
    finally:
        os.unlink(path)


def _child(cmd: list[str], what: str, pid: int) -> str:
    """Run an injector in an isolated child interpreter (this one: the raw injector needs its libc
    and libpython offsets). On timeout it gets SIGTERM first, so it can put the target's registers
    back and detach; only then SIGKILL."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise InjectFailed(
            f"{what} did not return within {TIMEOUT_S:.0f} s (stopped it); {describe_state(pid)}"
        ) from None
    if proc.returncode < 0:  # killed by a signal (not ours): the target's state is what matters
        raise InjectFailed(f"{what} was killed by signal {-proc.returncode}; {describe_state(pid)}")
    if proc.returncode != 0:
        err = (stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        if "PermissionError" in err or "ermission" in err or "not permitted" in err:
            raise InjectFailed(f"ptrace not permitted: {ptrace_hint()}")
        raise InjectFailed(err[:300])
    return stderr
