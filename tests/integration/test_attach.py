"""`diag attach` / `status` / `detach` on a live torch process that was never prepared for diag.

When sent SIGUSR1 the target writes a fingerprint of everything diag could change (threads, global
and per-module hooks, the functions of torch.nn.Module, Optimizer, ProcessGroup and
torch.distributed, profile and trace hooks); detach must bring back exactly the fingerprint taken
before attach. atexit is left out: CPython 3.11's `atexit._ncallbacks()` still counts an
unregistered slot, so it cannot show that detach removed the agent's exit flush.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.workloads import launch

pytestmark = pytest.mark.slow

TARGET = r"""
import atexit, json, os, signal, sys, threading, time
import torch, torch.distributed as dist
import torch.nn.modules.module as M
import torch.optim.optimizer as O
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
PG = torch._C._distributed_c10d.ProcessGroup
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

def ids(obj):
    return {k: id(v) for k, v in sorted(vars(obj).items()) if callable(v)}

def fingerprint(*_):
    hooks = {n: len(getattr(M, n)) for n in dir(M) if n.startswith("_global_") and n.endswith("hooks")}
    per_module = [{n: len(v) for n, v in vars(m).items() if n.endswith("hooks") and hasattr(v, "__len__")}
                  for m in model.modules()]
    state = {"threads": sorted(t.name for t in threading.enumerate()), "hooks": hooks,
             "module_hooks": per_module, "opt_hooks": [len(O._global_optimizer_pre_hooks),
             len(O._global_optimizer_post_hooks), len(opt._optimizer_step_pre_hooks),
             len(opt._optimizer_step_post_hooks)],
             "Module": ids(torch.nn.Module), "Optimizer": ids(torch.optim.Optimizer),
             "AdamW": ids(torch.optim.AdamW), "ProcessGroup": ids(PG), "c10d": ids(dist.distributed_c10d),
             "dist": ids(dist), "profile": repr(sys.getprofile()),
             "trace": repr(sys.gettrace())}
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])

signal.signal(signal.SIGUSR1, fingerprint)
print("ready", flush=True)
t = torch.ones(8)
while True:
    loss = model(torch.randn(4, 16)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    dist.all_reduce(t)
    time.sleep(0.02)
"""


def diag(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return launch.diag_cli(*args, timeout=timeout)


def _start_target(tmp_path_factory) -> tuple[subprocess.Popen, object]:
    """A target started, not yet awaited (`_ready`): its start is mostly `import torch`."""
    from tests.workloads.launch import free_port

    tmp_path = tmp_path_factory.mktemp("target")
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "fp.json"), str(free_port())],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return proc, tmp_path


def _ready(started: tuple[subprocess.Popen, object]):
    proc, _ = started
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield started
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def spare_targets(request, tmp_path_factory):
    """Targets of their own for the injectors of MALLOC_HAZARD this session runs, all started at once
    with the module's first target: each starts while the tests before it run (a start is ~15 s of
    one core's `import torch`, the tests leave the other core mostly idle), not in turn."""
    wanted = sum(
        1
        for item in request.session.items
        if item.module is request.module
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("method") in MALLOC_HAZARD
    )
    started = [_start_target(tmp_path_factory) for _ in range(wanted)]
    yield started
    for proc, _ in started:  # those no test took (a test failed before taking it)
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def target(tmp_path_factory, spare_targets):
    """One target for the module: each test must leave it as it found it, which is the point."""
    yield from _ready(_start_target(tmp_path_factory))


@pytest.fixture
def own_target(tmp_path_factory, spare_targets):
    """A target of its own for an injector that can deadlock it (`MALLOC_HAZARD`): once one did,
    under load in CI's compat leg, every later test of the shared target failed with it."""
    yield from _ready(spare_targets.pop() if spare_targets else _start_target(tmp_path_factory))


# the injectors that run code in a thread ptrace stopped (dlopen, gdb's calls), which deadlocks
# when it was stopped inside malloc: named only, never in the automatic order (their warning says so)
MALLOC_HAZARD = ("pyinjector", "hypno", "gdb")


def _deadlocked(pid: int) -> str | None:
    """The kernel function the target's main thread sleeps in when that is a futex wait (a lock it
    will never get: malloc's arena lock, the GIL), else None."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        return None
    return wchan if "futex" in wchan else None


def fingerprint(proc: subprocess.Popen, folder) -> dict:
    path = folder / "fp.json"
    if path.exists():
        path.unlink()
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline, "target did not write its fingerprint"
        time.sleep(0.02)
    return json.loads(path.read_text())


def events(trace_dir) -> list[dict]:
    out = []
    for name in os.listdir(trace_dir):
        with open(os.path.join(trace_dir, name)) as f:
            out.extend(json.loads(line) for line in f if line.endswith("\n"))
    return out


@pytest.mark.parametrize("method", ["ptrace", "pyinjector", "hypno", "gdb"])
def test_attach_status_detach_leaves_the_process_as_before(request, method):
    proc, folder = request.getfixturevalue("own_target" if method in MALLOC_HAZARD else "target")
    before = fingerprint(proc, folder)
    trace_dir = folder / f"trace-{method}"
    res = diag("attach", str(proc.pid), "--method", method, "-v", "--trace-dir", str(trace_dir))
    if method == "gdb" and "cannot call functions on this CPU" in res.stderr:
        pytest.skip(reason="this machine's gdb cannot call functions (extended-state bug): " + res.stderr)
    wchan = _deadlocked(proc.pid) if res.returncode and "did not return within" in res.stderr else None
    if wchan:
        pytest.skip(
            reason=f"{method} deadlocked the target (its main thread waits in {wchan}): the hazard "
            "its warning names, why the automatic order never uses it: " + res.stderr.strip()
        )
    assert res.returncode == 0, res.stderr
    assert f"via {method}" in res.stdout
    # only hypno takes the GIL from the ptrace-stopped thread, and says so
    assert ("can deadlock the rank" in res.stderr) == (method == "hypno"), res.stderr
    # the injectors the automatic order leaves out (malloc in the stopped thread) say why when named
    assert ("stopped inside malloc" in res.stderr) == (method != "ptrace"), res.stderr
    attached = fingerprint(proc, folder)
    assert {"diag-writer", "diag-control"} <= set(attached["threads"])
    assert attached != before
    again = diag("attach", str(proc.pid), "--trace-dir", str(trace_dir))
    assert "reusing the running agent" in again.stdout, again.stderr
    deadline = time.monotonic() + 10
    while not any(e["k"] == "step" for e in events(trace_dir)):
        assert time.monotonic() < deadline, f"no step events in {events(trace_dir)}"
        time.sleep(0.1)
    status = diag("status", str(proc.pid), "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["pid"] == proc.pid and "steps" in st["collectors"]
    assert sum(st["captured"].values()) > 0
    listed = diag("status")
    assert f"pid {proc.pid}" in listed.stdout
    assert diag("detach", str(proc.pid)).returncode == 0
    assert fingerprint(proc, folder) == before
    assert not os.path.exists(f"{_socket_dir()}/{proc.pid}.sock")
    gone = diag("status", str(proc.pid))
    assert gone.returncode != 0 and "not attached" in gone.stderr


def test_duration_detaches_by_itself(target):
    proc, folder = target
    before = fingerprint(proc, folder)
    res = diag("attach", str(proc.pid), "--duration", "0.5", "--trace-dir", str(folder / "t"))
    assert res.returncode == 0, res.stderr
    assert "detached" in res.stdout
    assert fingerprint(proc, folder) == before


def test_errors_are_one_line_and_nonzero(target, tmp_path):
    proc, _ = target
    dead = subprocess.Popen(["true"])
    dead.wait()
    sleeper = subprocess.Popen(["sleep", "30"])
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        cases = {
            str(dead.pid): "no such process",
            str(sleeper.pid): "is not a Python process",
            str(plain.pid): "has not imported torch",
        }
        for pid, message in cases.items():
            res = diag("attach", pid)
            assert res.returncode != 0
            assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
            assert "trace:" not in res.stdout  # nothing attached: no trace directory to name
        no_gdb = subprocess.run(
            [sys.executable, "-m", "diag", "attach", str(proc.pid), "--method", "gdb"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PATH": os.path.dirname(sys.executable)},
        )
        assert no_gdb.returncode != 0 and "gdb: gdb not found on PATH" in no_gdb.stderr
    finally:
        sleeper.kill()
        plain.kill()
        sleeper.wait()
        plain.wait()


@pytest.mark.skipif(os.getuid() != 0, reason="starting another user's process needs root")
def test_another_users_process_is_refused():
    other = subprocess.Popen(["sleep", "30"], user=65534)  # checked before "is it Python"
    try:
        res = diag("attach", str(other.pid))
        assert res.returncode != 0 and "belongs to another user" in res.stderr
    finally:
        other.kill()
        other.wait()


def _socket_dir() -> str:
    from diag.control import protocol

    return protocol.runtime_dir()


def test_run_preloads_the_agent_in_a_plain_python_command(tmp_path):
    script = (
        "import torch; m = torch.nn.Linear(2, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3): m(torch.ones(1, 2)).sum().backward(); o.step()\n"
    )
    res = diag(
        "run", "--what", "steps", "--trace-dir", str(tmp_path / "t"), "--", sys.executable, "-c", script
    )
    assert res.returncode == 0, res.stderr
    (name,) = os.listdir(tmp_path / "t")
    kinds = [e["k"] for e in events(tmp_path / "t")]
    assert name.startswith("pid-") and kinds.count("step") == 3, kinds  # flushed at exit
    bad = diag("run", "--")
    assert bad.returncode == 2 and "no command given" in bad.stderr
