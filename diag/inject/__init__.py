"""Getting the agent into a live Python process: preflight checks, the payload, the injectors.

`inject(pid, code, method)` tries, unless a method is named, only the strategies that cannot deadlock
a target stopped inside malloc: sys.remote_exec (3.14+), then diag's raw ptrace injector (no malloc
in the stopped thread). pyinjector and hypno make the stopped thread dlopen (which mallocs: it
deadlocked a real Megatron rank, issue 9), and gdb's inferior call strdup()s the payload: those run
only when asked for by name, with a warning. It reports which one worked, how long it took, every
method tried before it and why it failed, and any risk it took (a warning). Every strategy only
hands the code to the interpreter's own safe point (remote_exec, Py_AddPendingCall); only `hypno`,
or pyinjector without a C compiler, runs it from the ptrace-stopped thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from diag.errors import FAILURE, DiagError
from diag.inject.checks import Target
from diag.inject.failure import InjectFailed

__all__ = ["AUTO_ORDER", "METHODS", "InjectFailed", "inject", "risks"]

METHODS = ("remote_exec", "ptrace", "pyinjector", "hypno", "gdb")
AUTO_ORDER = ("remote_exec", "ptrace")  # no malloc in the stopped thread
MALLOC_RISK = (
    "makes the ptrace-stopped thread call malloc (dlopen/strdup), which deadlocks the "
    "rank if it was stopped inside malloc; the automatic order uses only remote_exec and ptrace"
)


# pyinjector (kubo/injector, which also injects hypno's library here) restores the stopped thread's
# general-purpose registers, not its AVX state (diag's ptrace injector saves NT_X86_XSTATE), and the
# dlopen it runs goes through glibc's AVX string functions. Measured on Megatron-DeepSpeed's
# pretrain_gpt.py (TP=2, fp16): attached with pyinjector at iteration 65, iteration 67 overflowed
# and every loss after it differed from the untouched run; ptrace attaches (four runs) and a hypno
# attach before it left them bit-identical.
XSTATE_RISK = (
    "does not restore the stopped thread's AVX registers (only its general-purpose ones), so an "
    "attach that lands inside a vectorized kernel can change the job's numbers (seen: an fp16 overflow "
    "the untouched run did not have)"
)


def risks(method: str) -> list[str]:
    """What a method named with --method risks in the target, worst first (nothing for the
    automatic order)."""
    if method in AUTO_ORDER:
        return []
    out = [f"--method {method} {MALLOC_RISK}"]
    if method in ("pyinjector", "hypno"):
        out.append(f"--method {method} {XSTATE_RISK}")
    return out


def _injector(method: str) -> Callable[[Target, str], str | None]:
    if method == "remote_exec":
        from diag.inject.remote_exec import inject as fn
    elif method in ("ptrace", "pyinjector", "hypno"):
        from diag.inject import ptrace

        fn = {
            "ptrace": ptrace.inject_raw,
            "pyinjector": ptrace.inject_pyinjector,
            "hypno": ptrace.inject_hypno,
        }[method]
    elif method == "gdb":
        from diag.inject.gdb import inject as fn
    else:
        raise DiagError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    return fn


def inject(
    target: Target, code: str, method: str | None = None, tried: list[str] | None = None
) -> tuple[str, float, str | None]:
    """Hand `code` to the target; returns (method used, seconds, warning). Each method that failed
    before is appended to `tried` as "method: why"; all of them are named when none worked."""
    tried = [] if tried is None else tried
    for name in (method,) if method else AUTO_ORDER:
        t0 = time.perf_counter()
        try:
            warning = _injector(name)(target, code)
        except InjectFailed as e:
            tried.append(f"{name}: {e}")
            continue
        if name not in AUTO_ORDER:
            warning = "; ".join(w for w in (*risks(name), warning) if w)
        return name, time.perf_counter() - t0, warning
    hint = (
        ""
        if method
        else (
            " (pyinjector, hypno and gdb, which can deadlock a rank stopped in malloc, "
            "run only when named with --method)"
        )
    )
    raise DiagError(f"could not inject into pid {target.pid}: " + "; ".join(tried) + hint, FAILURE)
