"""Fork leaks (issue 10): DataLoader workers forked after attach start without the agent (no hooks,
no ring filling up unwritten, no copy of the trace file or control socket), the parent keeps
tracing and serving `diag status`; with `follow_forks` a forked child gets an agent of its own."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys

import diag
from diag import agent
from tests.workloads import launch


def run_job(mode: str, trace_dir: str, env: dict[str, str]) -> dict:
    res = subprocess.run(
        [sys.executable, "-m", "tests.reliability.fork_job", mode, trace_dir],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=launch.ROOT,
        env=launch.job_env(env),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_dataloader_workers_start_clean(tmp_path, runtime_env) -> None:
    out = run_job("loader", str(tmp_path / "t"), runtime_env)
    parent = out["parent"]
    assert parent["socket"] and parent["status_pid"] > 0 and parent["undo"] > 0
    assert any(t.endswith(".jsonl") for t in parent["diag_fds"])
    assert any(t.startswith("socket:") for t in parent["diag_fds"])
    assert len(out["workers"]) == 4 and len({w["pid"] for w in out["workers"]}) == 2
    for w in out["workers"]:
        assert w["ring"] == 0, w  # before: 1000+ records per item, never written
        assert not w["current"] and w["undo"] == 0, w  # hooks undone, agent forgotten
        assert w["inherited"] == [], w  # neither the trace file nor the socket is held
    assert len(out["files"]) == 1, out["files"]  # the parent's only
    tr = diag.load(str(tmp_path / "t"))
    assert len(tr.headers) == 1 and not tr.problems
    assert set(tr.steps["step"]) >= {0, 1, 2}  # the parent traced on after its workers


def test_follow_forks_gives_the_child_its_own_agent(tmp_path, runtime_env) -> None:
    out = run_job("follow", str(tmp_path / "t"), runtime_env)
    assert out["child_exit"] == 0 and out["socket"]
    assert f"pid-{out['child']}.jsonl" in out["files"] and len(out["files"]) == 2
    tr = diag.load(str(tmp_path / "t"))
    assert len(tr.headers) == 2 and not tr.problems
    assert {1, 7} <= set(tr.steps["step"])


def test_trace_and_socket_descriptors_are_close_on_exec(tmp_path, runtime_env) -> None:
    from tests.reliability.fork_job import fds

    before = fds()
    agent.start(str(tmp_path / "t"), what=("steps",), control=True)
    try:
        mine = {fd: t for fd, t in fds().items() if before.get(fd) != t}
        assert any(t.endswith(".jsonl") for t in mine.values()), mine
        assert any(t.startswith("socket:") for t in mine.values()), mine
        for fd in mine:
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC, (fd, mine[fd])
    finally:
        agent.stop()
