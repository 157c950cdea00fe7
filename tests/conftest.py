"""Shared fixtures. The autouse `no_leftovers` fails any test that leaves the agent running, global
module hooks installed, or extra threads alive: diag promises to leave a process as it found it."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def sample_folders() -> list[str]:
    """Every folder of sample_traces/ and tests/fixtures/, sorted: the inputs that tests comparing
    two ways of reading run on."""
    return [
        os.path.join(ROOT, base, name)
        for base in ("sample_traces", os.path.join("tests", "fixtures"))
        for name in sorted(os.listdir(os.path.join(ROOT, base)))
        if os.path.isdir(os.path.join(ROOT, base, name))
    ]


def _global_hooks() -> dict[str, int]:
    mod = sys.modules.get("torch.nn.modules.module")
    if mod is None:
        return {}
    names = [n for n in dir(mod) if n.startswith("_global_") and n.endswith("hooks")]
    return {n: len(getattr(mod, n)) for n in names}


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("diag")}


@pytest.fixture(autouse=True)
def no_leftovers():
    hooks_before = _global_hooks()
    threads_before = _threads()
    yield
    from diag import agent

    leaked = agent.current()
    if leaked is not None:
        agent.stop()
        pytest.fail("test left the diag agent running")
    deadline = time.monotonic() + 5
    while _threads() - threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (_threads() - threads_before), f"diag threads left: {_threads() - threads_before}"
    assert _global_hooks() == {**hooks_before, **{k: 0 for k in _global_hooks() if k not in hooks_before}}, (
        "global hooks left"
    )


@pytest.fixture
def without_deepspeed(monkeypatch):
    """For plain torch loops: hide a DeepSpeed that an earlier test imported into this pytest process
    (tests/integration/ds_harness.py does). While DeepSpeed is loaded, the steps collector waits
    `TORCH_GRACE` torch optimizer steps for an engine (collectors/steps.py): a plain loop's first steps
    would not be boundaries, and its step numbers and layer samples would depend on test order."""
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)
