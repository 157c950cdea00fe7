"""gdb batch mode: queue the payload with Py_AddPendingCall (no GIL taken in the stopped thread).

The last resort: it needs gdb on PATH and ptrace, but no Python-version-specific tooling. Like
pending.c, it never calls PyGILState_Ensure from the thread gdb stopped (that deadlocks when the
thread was stopped inside the GIL handoff): PyRun_SimpleString runs later, on the main thread, at
the interpreter's next safe point, on a strdup'd copy of the code.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from diag.inject.checks import Target, ptrace_hint
from diag.inject.failure import InjectFailed

TIMEOUT_S = 60


def command(gdb: str, pid: int, code: str) -> list[str]:
    return [
        gdb,
        "-nx",
        "-batch",
        "-p",
        str(pid),
        "-iex",
        "set auto-solib-add off",  # symbols of torch's libraries take seconds to read
        "-ex",
        "set confirm off",
        "-ex",
        "sharedlibrary libpython",  # only the C API we call (no-op for static builds)
        "-ex",
        "sharedlibrary libc.so",  # strdup
        "-ex",
        "call (int)Py_AddPendingCall((void*)PyRun_SimpleString, "
        f'(void*)((char*(*)(const char*))strdup)("{escaped(code)}"))',
    ]


def escaped(code: str) -> str:
    """`code` as the inside of a C string literal (payload.code has no quotes or backslashes)."""
    return code.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


BROKEN = "Couldn't write extended state"  # gdb on some recent x86 CPUs (AMX xsave layout)


def can_call_functions(gdb: str) -> bool:
    """Try an inferior call on a throwaway `sleep` first: where gdb hits the extended-state bug, the
    failed call leaves the process's registers clobbered and it crashes (seen here), so the real
    target must never be the first to find out."""
    dummy = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc = subprocess.run(
            [
                gdb,
                "-nx",
                "-batch",
                "-p",
                str(dummy.pid),
                "-iex",
                "set auto-solib-add off",
                "-ex",
                "call (int)getpid()",
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        return BROKEN not in proc.stdout + proc.stderr
    finally:
        dummy.kill()
        dummy.wait()


def inject(target: Target, code: str) -> str | None:
    gdb = shutil.which("gdb")
    if gdb is None:
        raise InjectFailed("gdb not found on PATH")
    if not can_call_functions(gdb):
        raise InjectFailed(
            "this gdb cannot call functions on this CPU ('Couldn't write extended "
            "state status', checked on a dummy process); use --method ptrace"
        )
    try:
        proc = subprocess.run(
            command(gdb, target.pid, code), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise InjectFailed(f"gdb did not finish in {TIMEOUT_S} s") from None
    out = proc.stdout + proc.stderr
    if "Operation not permitted" in out:
        raise InjectFailed(f"ptrace not permitted: {ptrace_hint()}")
    if BROKEN in out:
        raise InjectFailed(
            "this gdb cannot call functions on this CPU ('Couldn't write extended "
            "state status'); use --method ptrace"
        )
    if not re.search(r"^\$1 = 0$", out, re.M):
        last = [ln for ln in out.splitlines() if ln.strip()][-1:] or ["no output"]
        raise InjectFailed(f"Py_AddPendingCall did not succeed ({last[0][:200]})")
    return None
