"""Getting the agent into a live Python process: preflight checks, the payload, the injectors.

`inject(pid, code, method)` tries the strategies in order (sys.remote_exec on 3.14+, a ptrace
injector without gdb, gdb batch mode) and reports which one worked and how long it took.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from diag.errors import FAILURE, DiagError
from diag.inject.checks import Target

METHODS = ("remote_exec", "pyinjector", "hypno", "gdb")
AUTO_ORDER = ("remote_exec", "pyinjector", "gdb")  # hypno is pyinjector + a lib in /tmp: by request


class InjectFailed(Exception):
    """One strategy could not run the code in the target (the message says why, one line)."""


def _injector(method: str) -> Callable[[Target, str], None]:
    if method == "remote_exec":
        from diag.inject.remote_exec import inject as fn
    elif method in ("pyinjector", "hypno"):
        from diag.inject import ptrace

        fn = ptrace.inject_pyinjector if method == "pyinjector" else ptrace.inject_hypno
    elif method == "gdb":
        from diag.inject.gdb import inject as fn
    else:
        raise DiagError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    return fn


def inject(target: Target, code: str, method: str | None = None) -> tuple[str, float]:
    """Run `code` in the target; returns (method used, seconds). Every failure is named."""
    tried: list[str] = []
    for name in (method,) if method else AUTO_ORDER:
        t0 = time.perf_counter()
        try:
            _injector(name)(target, code)
        except InjectFailed as e:
            tried.append(f"{name}: {e}")
            continue
        return name, time.perf_counter() - t0
    raise DiagError(f"could not inject into pid {target.pid}: " + "; ".join(tried), FAILURE)
