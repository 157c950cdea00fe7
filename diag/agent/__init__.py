"""`diag.agent.start()` / `stop()`: the in-process agent, one per process, idempotent.

Imports only the stdlib at module level (and torch lazily, from the collectors) so that it is safe to
inject into any training process.
"""

from __future__ import annotations

import threading
from typing import Any

from diag.agent.runtime import (
    ALL_COLLECTORS,
    DEFAULT_LAYERS_EVERY,
    DEFAULT_WHAT,
    Agent,
    default_trace_dir,
)

__all__ = ["ALL_COLLECTORS", "Agent", "current", "start", "stop"]

_lock = threading.Lock()
_agent: Agent | None = None


def start(trace_dir: str | None = None, what: str | tuple[str, ...] | list[str] | None = None,
          **options: Any) -> Agent:
    """Start the agent, or return the running one (a second attach reuses it).

    what: collectors to install, a tuple or a comma-separated string (default: all).
    options: layers_every (per-layer time and FLOPs on every Nth step; default 50, the always-on
    setting; 1 = every step), attribute_every (name the running module in comms records on the
    job's first N steps, every Nth step after them and sampled steps; default 10; 1 = every step,
    0 = sampled steps only; other steps skip module tracking, ~5 us per module call), flops_every
    (count FLOPs on the first sample of each input signature and every Nth after it, reuse them on
    the others; default 4; 1 = count on every sample),
    ring_capacity (records buffered before drops), self_time (add up the time spent in diag's hooks,
    shown by `diag status`: ~0.2 us more per hook), follow_forks (a child forked after start gets
    an agent of its own; by default forked children, DataLoader workers, start without one: see
    diag/agent/fork.py), faults (tests).
    """
    global _agent
    with _lock:
        if _agent is not None:
            return _agent
        if isinstance(what, str):
            what = tuple(w.strip() for w in what.split(",") if w.strip())
        names = tuple(what or DEFAULT_WHAT)
        unknown = [n for n in names if n not in ALL_COLLECTORS]
        if unknown:
            raise ValueError(f"unknown collector(s) {', '.join(unknown)}; "
                             f"choose from {', '.join(ALL_COLLECTORS)}")
        if "steps" not in names:
            names = ("steps", *names)  # step boundaries drive sampling and per-step memory
        options.setdefault("layers_every", DEFAULT_LAYERS_EVERY if "layers" in names else 0)
        agent = Agent(trace_dir or default_trace_dir(), names, options)
        agent.start()
        _agent = agent
        if options.get("control"):
            agent._start_control()  # serves `detach` only now that stop() can find this agent
        return agent


def stop() -> list[str]:
    """Stop the agent and undo every change it made; a no-op when none runs."""
    global _agent
    with _lock:
        agent, _agent = _agent, None
    return agent.stop() if agent is not None else []


def current() -> Agent | None:
    return _agent
