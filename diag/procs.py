"""From a pid the user gives to the training ranks to attach to (torchrun / deepspeed launchers).

A launcher (torchrun, `deepspeed`, `python -m deepspeed.launcher.launch`) imports torch too, so
"imports torch" alone does not tell a rank: ranks are the topmost Python descendants whose
environment carries RANK (their own data-loader workers inherit it but sit below them).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from diag.errors import FAILURE, USAGE, DiagError

if TYPE_CHECKING:  # (imported where used: `diag attach --help` needs no psutil, the attach extra)
    import psutil


def environ_rank(pid: int) -> int | None:
    """RANK from /proc/<pid>/environ (the value the process started with)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            value = item[5:].decode(errors="replace")
            return int(value) if value.isdigit() else None
    return None


def _is_python(proc: psutil.Process) -> bool:
    import psutil

    try:
        return "python" in proc.name().lower() or "python" in (proc.exe() or "").lower()
    except (psutil.Error, OSError):
        return False


def ranks_under(pid: int) -> list[tuple[int, int | None]]:
    """[(pid, rank)] of the ranks at or under `pid`, by rank; `[(pid, None)]` for a lone process."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        raise DiagError(f"no such process: {pid}", USAGE) from None
    if environ_rank(pid) is not None:
        return [(pid, environ_rank(pid))]
    found: list[tuple[int, int | None]] = []
    frontier = _children(root)
    while frontier:
        proc = frontier.pop(0)
        rank = environ_rank(proc.pid)
        if rank is not None and _is_python(proc):
            found.append((proc.pid, rank))
        else:
            frontier.extend(_children(proc))
    if not found:
        return [(pid, None)]
    return sorted(found, key=lambda pr: (pr[1] is None, pr[1] or 0))


def rank_targets(pid: int, nothing: str) -> list[tuple[int, int | None]]:
    """`ranks_under(pid)`, refusing a launcher with no rank under it: attached to, it records nothing
    of the training (it runs none), and its ranks are not started yet or have exited (`nothing`: what
    the user can do, or that there is nothing to do)."""
    ranks = ranks_under(pid)
    if ranks == [(pid, None)] and (launcher := launcher_of(pid)) is not None:
        raise DiagError(
            f"pid {pid} is a {launcher} launcher with no rank under it (not started yet, or exited): "
            + nothing,
            FAILURE,
        )
    return ranks


# what a launcher's command line names among its first words (`python -m torch.distributed.run`,
# `python /venv/bin/torchrun`, `python -u -m deepspeed.launcher.launch`, `python /venv/bin/deepspeed`)
LAUNCHER_SCRIPTS = ("torchrun", "deepspeed")
LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed.launcher.launch",
    "deepspeed.launcher.runner",
)


def launcher_of(pid: int) -> str | None:
    """The launcher `pid` runs (torchrun's or DeepSpeed's), None for any other process: attached to,
    a launcher records nothing of the training (it runs none), so a launcher with no ranks under it
    yet is not a target."""
    import psutil

    try:
        argv: list[str] = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return None
    for word in argv[:4]:
        if word in LAUNCHER_MODULES or os.path.basename(word) in LAUNCHER_SCRIPTS:
            return os.path.basename(word)
    return None


def _children(proc: psutil.Process) -> list[psutil.Process]:
    import psutil

    try:
        return list(proc.children())
    except psutil.Error:
        return []
