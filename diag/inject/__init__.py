"""Getting the agent into a live Python process: preflight checks, the payload, the injectors.

`inject(pid, code, method)` tries the strategies in order (sys.remote_exec on 3.14+, a ptrace
injector without gdb, gdb batch mode) and reports which one worked, how long it took, and any risk
it had to take (a warning). Every strategy only hands the code to the interpreter's own safe point
(remote_exec, Py_AddPendingCall); only `hypno`, or pyinjector without a C compiler, runs it from the
ptrace-stopped thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from diag.errors import FAILURE, DiagError
from diag.inject.checks import Target

METHODS = ("remote_exec", "ptrace", "pyinjector", "hypno", "gdb")
AUTO_ORDER = ("remote_exec", "ptrace", "pyinjector", "gdb")  # hypno takes the GIL: by request only


class InjectFailed(Exception):
    """One strategy could not run the code in the target (the message says why, one line)."""


def _injector(method: str) -> Callable[[Target, str], str | None]:
    if method == "remote_exec":
        from diag.inject.remote_exec import inject as fn
    elif method in ("ptrace", "pyinjector", "hypno"):
        from diag.inject import ptrace

        fn = {"ptrace": ptrace.inject_raw, "pyinjector": ptrace.inject_pyinjector,
              "hypno": ptrace.inject_hypno}[method]
    elif method == "gdb":
        from diag.inject.gdb import inject as fn
    else:
        raise DiagError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    return fn


def inject(target: Target, code: str, method: str | None = None) -> tuple[str, float, str | None]:
    """Hand `code` to the target; returns (method used, seconds, warning). Failures are named."""
    tried: list[str] = []
    for name in (method,) if method else AUTO_ORDER:
        t0 = time.perf_counter()
        try:
            warning = _injector(name)(target, code)
        except InjectFailed as e:
            tried.append(f"{name}: {e}")
            continue
        return name, time.perf_counter() - t0, warning
    raise DiagError(f"could not inject into pid {target.pid}: " + "; ".join(tried), FAILURE)
