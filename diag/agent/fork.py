"""Forked children start clean: a DataLoader worker forked after attach is not a rank diag follows.

Without this, each worker inherits a live copy of the agent: its hooks keep filling a ring that no
writer thread drains (the thread did not survive the fork; a worker's ring was seen full at 30,032
records, never written), and the parent's trace file and control socket stay open in every worker.
`watch()` registers, once per process, an at-fork handler that in the child

- takes the control socket out of the agent's undo list and closes the child's copy of it (the
  parent's socket file is left alone: it is the parent's),
- undoes every hook and wrapper in the child (the parent keeps its own), drops the child's copy of
  the ring and closes its copy of the trace file without writing to it,
- forgets the agent, so `diag attach` to the worker, or `diag.agent.start()` in it, starts afresh.

With the agent option `follow_forks` the child then starts its own agent (its own file, writer
thread and socket), for jobs whose ranks are forked after the agent started. Descriptors are also
opened close-on-exec (Python's default, made explicit in the writer), so exec'd children get none.
Nothing here may raise into the job: each step is guarded.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from diag.agent.wakeup import Wakeup

CONTROL_LABEL = "control-server"  # the undo label runtime gives the control server's stop
_registered = False


def watch(agent: Any) -> None:
    """Called when an agent starts: forks from now on leave the child without it."""
    global _registered
    if not _registered:
        os.register_at_fork(after_in_child=_in_child)
        _registered = True


def _in_child() -> None:
    try:
        from diag import agent as registry

        running = registry.current()
        if running is None:
            return
        registry._agent = None
        registry._lock = threading.Lock()  # another thread may have held it at the fork
        disable(running)
        if _option(running, "follow_forks"):
            threading.Thread(target=_restart, args=(running,), name="diag-fork-start", daemon=True).start()
    except Exception:  # noqa: BLE001 - a fork must never fail because of diag
        pass


def disable(agent: Any) -> None:
    """Make the child's copy of `agent` inert and release what it holds, without touching what the
    parent shares with it (the socket path, the file's contents)."""
    _step(_drop_control, agent)
    agent.emit = _drop
    _step(lambda a: a.step_listeners.clear(), agent)
    agent.layers_every = 0
    agent.sampled = False
    agent._lock = threading.Lock()  # the parent's writer thread may have held it at the fork
    stop = threading.Event()
    stop.set()
    agent._stop = stop
    agent._flush_now = Wakeup()
    _step(lambda a: a.undo.run(), agent)
    _step(lambda a: a.ring.drain(), agent)
    _step(lambda a: a._sched.close(), agent)
    file, agent._file = getattr(agent, "_file", None), None
    if file is not None:
        _step(lambda f: f.forget(), file)


def _drop_control(agent: Any) -> None:
    """Remove the control server's stop from the undo list (it would unlink the parent's socket
    file) and close the child's descriptors of its listening socket and selector."""
    actions = agent.undo._actions
    for label, fn in list(actions):
        if label == CONTROL_LABEL:
            actions.remove((label, fn))
            server = getattr(fn, "__self__", None)
            if server is not None:
                server.forget_in_child()


def _restart(old: Any) -> None:
    try:
        from diag import agent as registry

        registry.start_with(old.options)
    except Exception:  # noqa: BLE001 - the child runs on without diag
        pass


def _option(agent: Any, name: str) -> Any:
    return getattr(getattr(agent, "options", None), name, None)


def _step(fn: Any, arg: Any) -> None:
    try:
        fn(arg)
    except Exception:  # noqa: BLE001 - one failed step must not stop the others
        pass


def _drop(_rec: tuple[Any, ...]) -> None:
    """The child's `emit`: any hook still reached (a wrapper captured before the undo) records nothing."""
