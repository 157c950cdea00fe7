"""The code injected into a target, and the in-process half that it calls.

The injected string only fixes sys.path and calls `boot(options_file)` (on the main thread, as a
pending call, for the pending-call injectors); `boot` reads the options from a private 0600 file
(then deletes it) and starts the agent on a daemon thread, so the target's thread is held for
microseconds. A second attach finds the running agent and reuses it. A start
failure is written next to the socket as `<pid>.err` for the attach command to report.
Stdlib only: this module runs inside the training process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

import diag

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(diag.__file__)))
QUEUED_LIFE_S = 600.0  # a payload that runs later than this after attach starts nothing
# the agent imports torch's modules; while the job's own thread is importing torch it waits this long
# at most (under `diag attach`'s 30 s wait for the control socket), then says so
IMPORT_WAIT_S = 25.0


def write_options(pid: int, options: dict[str, Any]) -> str:
    """The options for one attach, in a fresh unguessable 0600 file in the per-user 0700 dir."""
    from diag.control import protocol

    name = f"attach-{pid}-{os.urandom(8).hex()}.json"
    return protocol.write_private(name, json.dumps(options).encode())


def code(options_file: str) -> str:
    """Two lines of Python with no double quotes or backslashes (safe in gdb's C string) that bind
    no names in the target's `__main__` and never raise: run as a pending call, an exception would
    surface in the job's main thread as a SystemError."""
    for s in (ROOT, options_file):
        if any(c in s for c in "'\"\\\n"):
            raise ValueError(f"path {s!r} contains quotes or backslashes")
    return (
        f"try:__import__('sys').path.count('{ROOT}') or __import__('sys').path.append('{ROOT}');"
        f"__import__('diag.inject.payload',None,None,['boot']).boot('{options_file}')\n"
        "except BaseException:pass\n"
    )


def boot(options_file: str) -> None:
    """Runs in the target's main thread (or the one the injector borrowed): hand off to a daemon
    thread at once."""
    threading.Thread(target=_start, args=(options_file,), name="diag-attach", daemon=True).start()


def _start(options_file: str) -> None:
    try:
        try:
            with open(options_file, encoding="utf-8") as f:
                expired = time.time() - os.fstat(f.fileno()).st_mtime > QUEUED_LIFE_S
                opts = json.load(f)
        except FileNotFoundError:
            return  # expired and swept by a later attach: the user was told it would not start
        os.unlink(options_file)
        if expired:
            return
        _wait_for_torch_import(time.monotonic() + IMPORT_WAIT_S)
        running = start_agent({**opts, "joined": True})  # mid-job: the step under way is partial
        if not os.path.exists(_socket()):
            raise RuntimeError(f"control socket missing: {running.error_messages}")
    except Exception as exc:  # noqa: BLE001 - report to the attach command, never to the job
        _report(exc)


def torch_importing() -> list[str]:
    """torch's modules whose import is under way (in sys.modules, their body still running)."""
    return [
        name
        for name, mod in list(sys.modules.items())
        if (name == "torch" or name.startswith("torch."))
        and getattr(getattr(mod, "__spec__", None), "_initializing", False)
    ]


def _wait_for_torch_import(deadline: float) -> None:
    """Return once no torch module is being imported. The agent's collectors import torch's modules
    from this thread: while the job's thread is inside `import torch`, it holds `torch`'s import lock
    and may next import a module this thread has begun (`torch.optim.optimizer`, whose parent it then
    waits for): Python breaks that cycle by raising `_DeadlockError` in the job's thread. An attach
    12 s into the public DDP tutorial's start, at load 4.5, killed both ranks that way."""
    while busy := torch_importing():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the job was still importing torch ({busy[-1]}) after {IMPORT_WAIT_S:.0f} s; "
                "nothing was started: attach again once it trains"
            )
        time.sleep(0.05)


def start_agent(opts: dict[str, Any]) -> Any:
    """Start (or reuse) the agent with its control socket; flush it at interpreter exit too, so a
    job that ends while attached loses nothing (the exit hook is removed again on detach)."""
    import atexit

    from diag import agent
    from diag.agent.options import AgentOptions

    if agent.current() is not None:
        return agent.current()
    running = agent.start_with(AgentOptions.from_mapping({**opts, "control": True}))  # checked here
    atexit.register(agent.stop)
    running.undo.call(lambda: atexit.unregister(agent.stop), "atexit")
    if agent.current() is not running:  # a detach came through the socket before this line
        atexit.unregister(agent.stop)
    return running


def _socket() -> str:
    from diag.control import protocol

    return protocol.socket_path(os.getpid())


def error_file(pid: int) -> str:
    from diag.control import protocol

    return os.path.join(protocol.runtime_dir(), f"{pid}.err")


def _report(exc: BaseException) -> None:
    try:
        msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        path = error_file(os.getpid())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(msg.splitlines()[-1][:500])
    except Exception:  # noqa: BLE001 - nothing else we can do inside the job
        pass
