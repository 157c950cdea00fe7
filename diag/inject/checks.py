"""Preflight checks before injecting: each failure becomes one specific line (memray's model).

Everything is read from /proc without touching the target: owner, executable, loaded libraries
(libpython's version, torch), and whether this kernel lets us ptrace it at all.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from diag.errors import FAILURE, USAGE, DiagError
from diag.live.looker import status_fields  # (the looks' own reader: one /proc parser)

MIN_PYTHON = (3, 10)
CAP_SYS_PTRACE = 19
PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
_VERSION = re.compile(r"python(\d)\.(\d+)")


@dataclass(frozen=True)
class Target:
    pid: int
    exe: str
    version: tuple[int, int]
    has_torch: bool


def inspect(pid: int, need_torch: bool = True) -> Target:
    """Check that `pid` is our own live Python >= 3.10 process (with torch imported, by default),
    not stopped and not traced by someone else."""
    try:
        st = os.stat(f"/proc/{pid}")
    except FileNotFoundError:
        raise DiagError(f"no such process: {pid}", USAGE) from None
    if st.st_uid != os.getuid():
        raise DiagError(f"pid {pid} belongs to another user (uid {st.st_uid}); attach as that user", FAILURE)
    why = not_attachable(pid)
    if why is not None:
        raise DiagError(why, FAILURE)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except (PermissionError, FileNotFoundError) as e:
        raise DiagError(f"pid {pid}: cannot read /proc/{pid} ({e.strerror})", FAILURE) from None
    version = python_version(exe, maps)
    if version is None:
        raise not_python_error(pid, exe)
    if version < MIN_PYTHON:
        raise DiagError(
            f"pid {pid} runs Python {version[0]}.{version[1]}; diag needs "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer",
            FAILURE,
        )
    has_torch = "/torch/lib/libtorch" in maps or "/torch/_C" in maps
    if need_torch and not has_torch:
        raise DiagError(
            f"pid {pid} has not imported torch (attach once the job has started, or pass --no-torch)", FAILURE
        )
    return Target(pid, exe, version, has_torch)


def not_python_error(pid: int, exe: str) -> DiagError:
    """What attach and stacks say of a process that runs no Python."""
    return DiagError(f"pid {pid} is not a Python process ({exe})", FAILURE)


def python_version(exe: str, maps: str) -> tuple[int, int] | None:
    """From libpython3.X in the mapped libraries, else from the executable (static builds)."""
    m = re.search(r"libpython(\d)\.(\d+)", maps) or _VERSION.search(os.path.basename(exe))
    if m:
        return int(m.group(1)), int(m.group(2))
    if not os.path.basename(exe).startswith("python"):
        return None
    out = subprocess.run(
        [exe, "-I", "-S", "-c", "import sys;print('python%d.%d'%sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout
    m = _VERSION.search(out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def not_attachable(pid: int) -> str | None:
    """Why a process that exists cannot be attached now, from /proc/<pid>/status: exited but not
    reaped, stopped, or already traced (each used to surface as a misleading error later)."""
    fields = status_fields(pid)
    if fields is None:
        return f"no such process: {pid}"
    state = fields.get("State", "")
    if state[:1] in ("Z", "X"):
        return f"pid {pid} has exited ({state}; its parent has not reaped it yet)"
    tracer = fields.get("TracerPid", "0")
    if tracer not in ("0", ""):
        return (
            f"pid {pid} is already traced by pid {tracer} ({_name(tracer)}): a debugger or strace; "
            "only one tracer at a time, detach it first"
        )
    if state[:1] in ("T", "t"):
        return (
            f"pid {pid} is stopped ({state}): its Python code cannot run; resume it with "
            f"`kill -CONT {pid}`, then attach"
        )
    return None


def runtime_dir_mismatch(pid: int) -> str | None:
    """The agent puts its socket under the target's own XDG_RUNTIME_DIR: when that differs from
    ours, attach would inject an agent it can never reach (and status would not list it)."""
    from diag.control import protocol

    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        return None
    raw = env.get(b"XDG_RUNTIME_DIR")
    theirs = protocol.runtime_base(raw.decode(errors="replace") if raw else None, os.getuid())
    ours = protocol.runtime_base(os.environ.get("XDG_RUNTIME_DIR"), os.getuid())
    if theirs == ours:
        return None
    fix = f"XDG_RUNTIME_DIR={raw.decode(errors='replace')}" if raw else "XDG_RUNTIME_DIR unset"
    return (
        f"pid {pid} keeps diag's sockets in {theirs}, this shell in {ours}: run diag with "
        f"{fix}, as the job has it"
    )


def _name(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def ptrace_hint(scope_file: str = PTRACE_SCOPE, status_file: str = "/proc/self/status") -> str:
    """Why ptrace may be refused here, for the error line: the yama scope and CAP_SYS_PTRACE."""
    try:
        with open(scope_file) as f:
            scope = int(f.read().strip())
    except (OSError, ValueError):
        scope = 0
    cap = _has_cap_sys_ptrace(status_file)
    if scope == 3:
        return "kernel.yama.ptrace_scope=3 forbids ptrace until reboot: use `diag run` instead"
    if scope >= 1 and not cap:
        return (
            f"kernel.yama.ptrace_scope={scope}: run `sudo sysctl kernel.yama.ptrace_scope=0`, "
            "or grant CAP_SYS_PTRACE, or use `diag run`"
        )
    if not cap:
        return "no CAP_SYS_PTRACE (containers: --cap-add SYS_PTRACE), or use `diag run`"
    return "ptrace was refused (seccomp or a security module?); `diag run` needs no ptrace"


def _has_cap_sys_ptrace(status_file: str) -> bool:
    try:
        with open(status_file) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError):
        pass
    return False


def stopped_state(pid: int) -> str | None:
    """The process' state where it is stopped (SIGSTOP, a debugger: `T (stopped)`, `t (tracing
    stop)`), None otherwise: it cannot answer a control socket until resumed."""
    state = (status_fields(pid) or {}).get("State", "")
    return state if state[:1] in ("T", "t") else None


def describe_state(pid: int) -> str:
    """What became of the target after an injector went away abnormally, for the error line."""
    fields = status_fields(pid)
    if fields is None:
        return f"pid {pid} has exited"
    state = fields.get("State", "?")
    if state[:1] in ("T", "t"):
        return f"pid {pid} is left stopped ({state}): resume it with `kill -CONT {pid}`"
    if state[:1] in ("Z", "X"):
        return f"pid {pid} has exited ({state})"
    return f"pid {pid} is running ({state})"
