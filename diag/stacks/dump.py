"""py-spy dumps of live processes, reduced to each process's main-thread stack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from diag.errors import FAILURE, DiagError
from diag.inject.checks import not_python_error, python_version
from diag.live.looker import status_fields

TIMEOUT_S = 30
TRIES = 3  # a read of a changing stack fails now and then; the next one usually succeeds
RETRY_S = 0.2


@dataclass(frozen=True)
class Frame:
    name: str
    file: str  # full path, as py-spy reports it
    line: int

    def short(self) -> str:
        return f"{self.name} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass
class RankStack:
    pid: int
    rank: int | None
    frames: list[Frame]  # innermost first, as py-spy orders them
    thread: str = "MainThread"
    other_threads: dict[str, list[Frame]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"


def dump(pid: int, native: bool = False) -> list[dict[str, Any]]:
    """`py-spy dump --json` of one process: a list of threads with their frames."""
    # the venv's scripts directory first: `.venv/bin/diag` works without activating the venv
    exe = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if exe is None:
        raise DiagError("py-spy not found on PATH (pip install diag[attach])", FAILURE)
    base = [exe, "dump", "--pid", str(pid), "--json", *(["--native"] if native else [])]
    why = "failed"
    for attempt in range(TRIES):
        # py-spy cannot suspend a stopped process ("Failed to get stack traces", issue 17); one that
        # is stopped does not move, so reading it without suspending it is exact
        cmd = [*base, "--nonblocking"] if stopped(pid) else base
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        if proc.returncode == 0:
            try:
                threads: list[dict[str, Any]] = json.loads(proc.stdout)
                return threads
            except json.JSONDecodeError:
                why = "py-spy printed no JSON"
        else:
            why = _reason(proc.stderr)
        other = not_python(pid)
        if other is not None:  # py-spy's "Failed to find python version" does not say what is wrong
            raise not_python_error(pid, other)
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(RETRY_S * (attempt + 1))
    raise DiagError(f"py-spy dump of pid {pid} failed: {why}", FAILURE)


def not_python(pid: int) -> str | None:
    """The executable of a live process that runs no Python, by attach's own check (libpython in
    its maps, else the executable's name or version); None when it does, or cannot be read."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except OSError:
        return None
    return exe if python_version(exe, maps) is None else None


def stopped(pid: int) -> bool:
    """Is the process stopped (state T: SIGSTOP, or t: stopped by a tracer)?"""
    fields = status_fields(pid)
    return fields is not None and fields.get("State", "")[:1] in ("T", "t")


def _reason(stderr: str) -> str:
    """The line that says what went wrong. py-spy reads a moving target and can fail or panic on
    a stack that changed under it (then stderr ends in a Rust backtrace such as `10: main`)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("Error") or "panicked" in ln:
            return ln
    return lines[0] if lines else "failed"


def rank_stack(pid: int, rank: int | None, threads: list[dict[str, Any]]) -> RankStack:
    """The main thread's stack (the training loop), the other threads kept for the full listing."""
    parsed = {t.get("thread_name") or str(t.get("thread_id")): _frames(t) for t in threads}
    main = "MainThread" if "MainThread" in parsed else next(iter(parsed), "none")
    frames = parsed.pop(main, [])
    return RankStack(pid, rank, frames, main, parsed)


def _frames(thread: dict[str, Any]) -> list[Frame]:
    """The thread's frames without diag's own (its comms and overflow wrappers, its `Work.wait`):
    they are not where the job is, and would hide which collective it waits in."""
    own = own_roots()
    return [
        Frame(f.get("name", "?"), f.get("filename", "?"), int(f.get("line") or 0))
        for f in thread.get("frames", [])
        if not str(f.get("filename", "")).startswith(own)
    ]


def own_roots() -> tuple[str, ...]:
    """Folders of diag's packages (diag, diag.collectors, diag.analyzers: separate folders in a
    checkout), as the job imports them from the same installation."""
    import diag

    roots = {os.path.dirname(os.path.abspath(diag.__file__))}
    for sub in ("collectors", "analyzers"):
        try:
            mod = __import__(f"diag.{sub}", fromlist=["__path__"])
            roots.update(os.path.abspath(p) for p in mod.__path__)
        except ImportError:
            continue
    return tuple(r + os.sep for r in sorted(roots))
