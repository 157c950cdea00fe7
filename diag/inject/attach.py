"""Attach to one process: preflight, reuse a running agent, or inject the payload and wait for it."""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass
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


def attach_one(pid: int, rank: int | None, options: dict[str, Any], method: str | None,
               need_torch: bool) -> Attached:
    target = checks.inspect(pid, need_torch=need_torch)
    if _answers(pid):
        return Attached(pid, rank, None, 0.0, reused=True)
    err = payload.error_file(pid)
    if os.path.exists(err):
        os.unlink(err)
    opts_file = payload.write_options(pid, options)
    try:
        used, seconds = inject(target, payload.code(opts_file), method)
        _wait_ready(pid, err)
    finally:
        for leftover in [opts_file, *glob.glob(os.path.join(protocol.runtime_dir(), f"inject-{pid}-*"))]:
            if os.path.exists(leftover):
                os.unlink(leftover)
    return Attached(pid, rank, used, seconds)


def _answers(pid: int) -> bool:
    from diag.control.client import request

    if not os.path.exists(protocol.socket_path(pid)):
        return False
    try:
        request(pid, "status", timeout=2.0)
    except DiagError:
        return False
    return True


def _wait_ready(pid: int, err_file: str) -> None:
    """The agent is up when its control socket exists; a start failure leaves `<pid>.err`."""
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
    raise DiagError(f"pid {pid}: code was injected but the agent did not start within "
                    f"{READY_TIMEOUT_S:.0f} s (is the process blocked holding the GIL?)", FAILURE)
