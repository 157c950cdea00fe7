"""The collectors' contract with the agent: `AgentAPI` names all they use, and they keep their own
objects in the typed `agent.state` registry instead of adding attributes to the agent."""

from __future__ import annotations

import ast
import glob
import os
import sys
import time

import pytest

from diag import agent as diag_agent
from diag.agent.api import AgentAPI, CollectorState
from diag.agent.options import AgentOptions
from diag.agent.runtime import Agent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_installing_every_collector_adds_no_attribute_to_the_agent(tmp_path) -> None:
    fresh = set(vars(Agent(AgentOptions(trace_dir=str(tmp_path / "unused")))))
    ag = diag_agent.start(str(tmp_path))
    try:
        assert sorted(ag.installed) == sorted(ag.what)
        assert set(vars(ag)) == fresh
    finally:
        diag_agent.stop()


def test_the_runtime_agent_has_every_member_of_the_protocol(tmp_path) -> None:
    ag = Agent(AgentOptions(trace_dir=str(tmp_path)))
    members = set(AgentAPI.__annotations__) | {
        n for n, v in vars(AgentAPI).items() if callable(v) and not n.startswith("_")
    }
    assert {"emit", "guard", "state", "step_listeners", "options"} <= members
    assert [m for m in sorted(members) if not hasattr(ag, m)] == []


def _agent_attributes_used_by_collectors() -> set[str]:
    """Attribute names read or written on a name `agent` / `self.agent` in collectors/*.py."""
    used: set[str] = set()
    for path in glob.glob(os.path.join(ROOT, "collectors", "*.py")):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "agent") or (
                isinstance(base, ast.Attribute)
                and base.attr == "agent"
                and isinstance(base.value, ast.Name)
                and base.value.id == "self"
            ):
                used.add(node.attr)
    return used


def test_collectors_use_only_the_protocol() -> None:
    members = set(AgentAPI.__annotations__) | {n for n, v in vars(AgentAPI).items() if callable(v)}
    used = _agent_attributes_used_by_collectors()
    assert used and used <= members, sorted(used - members)


def test_state_is_keyed_by_class() -> None:
    class Tracker:
        pass

    state, tracker = CollectorState(), Tracker()
    assert state.get(Tracker) is None and Tracker not in state
    state.put(tracker)
    assert state.get(Tracker) is tracker and Tracker in state
    state.remove(Tracker)
    assert state.get(Tracker) is None


def test_every_collector_with_an_installer_is_registered_and_resolves() -> None:
    import importlib

    from diag.agent.registry import COLLECTORS

    with_install = set()
    # a collector is a module of collectors/ or a sub-package's __init__ (comms); the sub-package's
    # own parts (comms/timing.py's install) are not collectors
    paths = glob.glob(os.path.join(ROOT, "collectors", "*.py"))
    paths += glob.glob(os.path.join(ROOT, "collectors", "*", "__init__.py"))
    for path in paths:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        if any(isinstance(n, ast.FunctionDef) and n.name == "install" for n in tree.body):
            rel = os.path.relpath(path, os.path.join(ROOT, "collectors"))[:-3].removesuffix("/__init__")
            with_install.add(f"diag.collectors.{rel.replace(os.sep, '.')}")
    assert set(COLLECTORS.values()) == with_install
    for name, module in COLLECTORS.items():
        assert callable(importlib.import_module(module).install), name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names in /proc are Linux's")
def test_the_agents_threads_are_named_in_the_kernel(tmp_path, monkeypatch) -> None:
    """`ls /proc/PID/task/*/comm` tells diag's threads from the job's (a new user checking that a
    detach left none saw `python3.11` for every thread: Python 3.11 names threads for itself)."""

    def kernel_names() -> set[str]:
        out = set()
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                out.add(f.read().strip())
        return out

    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))  # (the control socket's private directory)
    diag_agent.start(str(tmp_path / "trace"), what=("steps",), control=True)
    try:
        deadline = time.monotonic() + 10
        while not {"diag-writer", "diag-control"} <= kernel_names():
            assert time.monotonic() < deadline, kernel_names()
            time.sleep(0.02)
    finally:
        diag_agent.stop()
    # (a joined thread's kernel task can outlive `join` by a moment on a loaded machine)
    deadline = time.monotonic() + 10
    while left := {name for name in kernel_names() if name.startswith("diag-")}:
        assert time.monotonic() < deadline, left
        time.sleep(0.02)
