"""`diag attach` to a job still inside `import torch` (the public DDP tutorial, attached 12 s into
its start at load 4.5: both ranks died with `_DeadlockError: deadlock detected by
_ModuleLock('torch.optim.optimizer')`; here, without the wait, `ImportError: cannot import name
'_to_scalar' from partially initialized module 'torch.optim.optimizer'`). The agent's thread imported
torch's modules while the job's thread held `torch`'s import lock; the agent now waits for that
import to end.

The target holds its own `import torch` open before `torch.optim`'s body (a loader that waits for a
file), so the attach lands inside the import every time, and lets it go after the agent has had time
to reach its imports."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.workloads import launch

pytestmark = pytest.mark.slow

TARGET = r"""
import importlib.abc, importlib.machinery, os, sys, time
READY, GO = sys.argv[1] + ".ready", sys.argv[1] + ".go"

class Held(importlib.abc.Loader):
    # runs torch.optim's body once told to: meanwhile this thread holds the import locks of
    # `torch` and `torch.optim` (not the global one, so other threads may import)
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        open(READY, "w").close()
        while not os.path.exists(GO):
            time.sleep(0.01)
        self.inner.exec_module(module)

class Gate(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.optim":  # torch/__init__ imports it; its body imports torch.optim.optimizer
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = Held(spec.loader)
        return spec

sys.meta_path.insert(0, Gate())
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
end = time.monotonic() + 6
while time.monotonic() < end:
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
print("trained", flush=True)
"""


def _wait_for(path: str, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def test_attach_inside_import_torch_waits_for_it(tmp_path):
    script, base = tmp_path / "target.py", str(tmp_path / "gate")
    script.write_text(TARGET)
    proc = subprocess.Popen(
        [sys.executable, str(script), base],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        _wait_for(base + ".ready", proc, 120)  # the job's thread is inside `import torch`
        trace = tmp_path / "trace"
        attach = subprocess.Popen(
            [sys.executable, "-m", "diag", "attach", str(proc.pid), "-v", "--trace-dir", str(trace)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=launch.ROOT,
            env=launch.job_env(None),
        )
        time.sleep(6)  # the agent's thread is up and would be inside its imports by now
        open(base + ".go", "w").close()
        _, err = attach.communicate(timeout=120)
        job_out, job_err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "trained" in job_out, job_err[-3000:]
    assert "DeadlockError" not in job_err
    assert attach.returncode == 0, err
    assert any(name.endswith(".jsonl") for name in os.listdir(trace)), os.listdir(trace)  # pid-N: no rank
