"""Attach to one process: preflight, reuse a running agent, or inject the payload and wait for it.

With a pending-call injector the payload runs when the target's main thread next executes
bytecode; a main thread stuck in one long C call delays the agent, and the wait says so."""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass, field
from typing import Any

from diag.control import protocol
from diag.errors import FAILURE, DiagError
from diag.inject import checks, inject, payload

READY_TIMEOUT_S = 30.0


@dataclass
class Attached:
    pid: int
    rank: int | None
    method: str | None
    inject_s: float
    reused: bool = False
    warning: str | None = None  # a risk the injector had to take (the GIL path)
    tried: list[str] = field(default_factory=list)  # "method: why it failed", before `method`


class Queued(DiagError):
    """The payload waits in the target for its main thread; its files must stay until it runs."""


def attach_one(
    pid: int, rank: int | None, options: dict[str, Any], method: str | None, need_torch: bool
) -> Attached:
    target = checks.inspect(pid, need_torch=need_torch)
    mismatch = checks.runtime_dir_mismatch(pid)
    if mismatch is not None:
        raise DiagError(mismatch, FAILURE)
    if _answers(pid):
        return Attached(pid, rank, None, 0.0, reused=True)
    sweep_expired()
    err = payload.error_file(pid)
    if os.path.exists(err):
        os.unlink(err)
    opts_file = payload.write_options(pid, options)
    keep = False
    tried: list[str] = []
    try:
        used, seconds, warning = inject(target, payload.code(opts_file), method, tried)
        _wait_ready(pid, err, opts_file)
    except Queued:
        keep = True  # the payload will still read its options file
        raise
    finally:
        if not keep:
            _remove_leftovers(pid, opts_file)
    return Attached(pid, rank, used, seconds, warning=warning, tried=tried)


def _remove_leftovers(pid: int, opts_file: str) -> None:
    for leftover in [opts_file, *glob.glob(os.path.join(protocol.runtime_dir(), f"inject-{pid}-*"))]:
        if os.path.exists(leftover):
            os.unlink(leftover)


def sweep_expired(now: float | None = None) -> list[str]:
    """Remove payload files (options, injector scripts) past a queued payload's life, or whose
    process is gone: a payload that runs later finds no options and starts nothing."""
    now = time.time() if now is None else now
    removed = []
    base = protocol.runtime_dir()
    for name in os.listdir(base):
        parts = name.split("-")
        if len(parts) < 3 or parts[0] not in ("attach", "inject") or not parts[1].isdigit():
            continue
        path = os.path.join(base, name)
        try:
            old = now - os.lstat(path).st_mtime > payload.QUEUED_LIFE_S
            if old or not os.path.exists(f"/proc/{parts[1]}"):
                os.unlink(path)
                removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def _answers(pid: int) -> bool:
    from diag.control.client import request

    if not os.path.exists(protocol.socket_path(pid)):
        return False
    try:
        request(pid, "status", timeout=2.0)
    except DiagError:
        return False
    return True


def _wait_ready(pid: int, err_file: str, opts_file: str) -> None:
    """The agent is up when its control socket exists; a start failure leaves `<pid>.err`; the
    payload has run once it has read (and removed) its options file."""
    sock = protocol.socket_path(pid)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if os.path.exists(sock):
            return
        if os.path.exists(err_file):
            with open(err_file) as f:
                msg = f.read().strip()
            os.unlink(err_file)
            raise DiagError(f"pid {pid}: the agent failed to start: {msg}", FAILURE)
        time.sleep(0.01)
    if not os.path.exists(opts_file):
        raise DiagError(
            f"pid {pid}: the payload ran but the agent's control socket did not appear "
            f"within {READY_TIMEOUT_S:.0f} s (still importing? see `diag status {pid}`)",
            FAILURE,
        )
    why = checks.not_attachable(pid)  # stopped or gone meanwhile: say that, not "no Python code"
    if why is not None:
        raise Queued(
            f"{why} (the agent will start if it resumes within {payload.QUEUED_LIFE_S / 60:.0f} min)", FAILURE
        )
    raise Queued(
        f"pid {pid}: the target's main thread has not run Python code for "
        f"{READY_TIMEOUT_S:.0f} s; the agent will start if it does within "
        f"{payload.QUEUED_LIFE_S / 60:.0f} min (the payload waits as a pending call, then "
        f"expires; see `diag status {pid}`)",
        FAILURE,
    )
