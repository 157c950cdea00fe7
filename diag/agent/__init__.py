"""`diag.agent.start()` / `stop()`: the in-process agent, one per process, idempotent.

Imports only the stdlib at module level (and torch lazily, from the collectors) so that it is safe to
inject into any training process.
"""

from __future__ import annotations

import threading
from typing import Any

from diag.agent.options import AgentOptions
from diag.agent.registry import ALL_COLLECTORS, OptionError
from diag.agent.runtime import Agent

__all__ = ["ALL_COLLECTORS", "Agent", "AgentOptions", "OptionError", "current", "start", "start_with", "stop"]

_lock = threading.Lock()
_agent: Agent | None = None


def start(
    trace_dir: str | None = None, what: str | tuple[str, ...] | list[str] | None = None, **options: Any
) -> Agent:
    """Start the agent, or return the running one (a second attach reuses it).

    what: collectors to install, a tuple or a comma-separated string (default: all). The options and
    their defaults are `AgentOptions`'s fields; an unknown or malformed one raises `OptionError`.
    A child forked after start starts without an agent (DataLoader workers) unless `follow_forks`
    is set: see diag/agent/fork.py.
    """
    return start_with(AgentOptions.from_mapping({"trace_dir": trace_dir, "what": what, **options}))


def start_with(options: AgentOptions) -> Agent:
    """`start` with options already checked."""
    global _agent
    with _lock:
        if _agent is not None:
            return _agent
        agent = Agent(options)
        agent.start()
        _agent = agent
        if options.control:
            agent._start_control(lambda: _detach(agent))  # serves `detach` only now that stop() can find it
        return agent


def _detach(agent: Agent) -> list[str]:
    """A control socket's `detach`: stop the agent as `stop()` does if it is the current one."""
    return stop() if current() is agent else agent.stop()


def stop() -> list[str]:
    """Stop the agent and undo every change it made; a no-op when none runs."""
    global _agent
    with _lock:
        agent, _agent = _agent, None
    return agent.stop() if agent is not None else []


def current() -> Agent | None:
    return _agent
