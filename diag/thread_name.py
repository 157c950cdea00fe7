"""A diag thread's name where the OS shows it (`/proc/PID/task/TID/comm`, `top -H`, `ps -L`):
before Python 3.14 a thread's name is Python's alone, so a user listing a rank's threads after a
detach saw `python3.11` for diag's own as for the job's and could not tell whether any was left."""

from __future__ import annotations

import sys
import threading

_PR_SET_NAME = 15  # prctl(2): the calling thread's name, 15 bytes at most


def name_this_thread() -> None:
    """Give the calling thread its Python name in the kernel too (Linux); never raises."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        name = threading.current_thread().name.encode("utf-8", "replace")[:15]
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except Exception:  # noqa: BLE001 - a name is a courtesy: never a failure in the job
        pass
