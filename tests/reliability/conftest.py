"""Fixtures of the reliability suite: the untouched baseline run (shared by every module), a private
runtime directory for control sockets, and the 64 kB tmpfs of the agent-limits tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.reliability import jobs
from tests.unit.test_agent_limits import tiny_tmpfs  # noqa: F401 - the same 64 kB mount, reused


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The held job run to MAX_STEPS without diag: losses, skipped steps and its fingerprint."""
    return jobs.run_fixed(str(tmp_path_factory.mktemp("baseline")), ["--steps", str(jobs.MAX_STEPS)])


@pytest.fixture(scope="module")
def runtime_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private XDG_RUNTIME_DIR shared by the jobs and this process (where control sockets live)."""
    path = tmp_path_factory.mktemp("xdg")
    os.chmod(path, 0o700)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_RUNTIME_DIR", str(path))
        yield {"XDG_RUNTIME_DIR": str(path)}
