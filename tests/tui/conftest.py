"""Fixtures of the TUI tests: a real recorded 2-rank DeepSpeed trace (sample_traces/healthy when
the generator has produced it, else recorded here once per session with the same workload)."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tests.conftest import ROOT

RECORD_ARGS = ["--diag", "--steps", "8", "--layers-every", "2", "--dtype", "fp16", "--overflow-at", "3"]


def _has_trace(path: str) -> bool:
    return os.path.isdir(path) and any(f.startswith("rank-") for f in os.listdir(path))


@pytest.fixture(scope="session")
def real_trace(tmp_path_factory) -> str:
    sample = os.path.join(ROOT, "sample_traces", "healthy")
    if _has_trace(sample):
        return sample
    from tests.workloads import launch

    out = str(tmp_path_factory.mktemp("recorded"))
    launch.run("tests.workloads.gpt_ds", [*RECORD_ARGS, "--trace-dir", out])
    return out


async def wait_for(pilot, cond, tries: int = 200) -> None:
    """Let the worker thread and the UI catch up until `cond()` holds (no wall-time asserts)."""
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError("the app did not reach the expected state")


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async Pilot test in its own event loop (no pytest async plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper
