"""A real 2-rank gloo hang (rank 1 skips an all_reduce) under `diag run`: `diag stacks` on the
launcher must name rank 0 as stuck in all_reduce and rank 1 as never arrived, in wait_for_data."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from diag import schema
from diag.procs import ranks_under
from tests.conftest import ROOT
from tests.workloads import launch

pytestmark = pytest.mark.slow
HANG_AT = 5


def test_stacks_names_the_stuck_rank_and_collective(tmp_path):
    trace = tmp_path / "trace"
    env = launch.job_env({"XDG_RUNTIME_DIR": str(tmp_path)})  # sockets of the killed job stay here
    cmd = [
        sys.executable,
        "-m",
        "diag",
        "run",
        "--trace-dir",
        str(trace),
        "--what",
        "comms",
        "--",
        *launch.torchrun_cmd(
            "tests.workloads.hang", ["--out", str(tmp_path), "--hang-at", str(HANG_AT), "--max-wait", "90"]
        ),
    ]
    job = subprocess.Popen(
        cmd, env=env, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"rank-{r}.state").exists() for r in (0, 1)):
            assert job.poll() is None and time.monotonic() < deadline, "the job never reached the hang"
            time.sleep(0.2)
        time.sleep(0.5)  # rank 0 enters all_reduce right after writing its marker
        names = sorted(os.listdir(trace))
        assert names == ["rank-00000.jsonl", "rank-00001.jsonl"], "the launcher must not be traced"
        res = subprocess.run(
            [sys.executable, "-m", "diag", "stacks", str(job.pid), "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env=env,
        )
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["verdict"].startswith("rank 0 stuck in all_reduce"), out
        assert "never arrived: rank 1 (in wait_for_data (hang.py:" in out["verdict"]
        assert [g["ranks"] for g in out["groups"]] in ([[0], [1]], [[1], [0]])
        if importlib.util.find_spec("diag.collectors.comms") is not None:  # the join with the trace
            assert f"collective #{HANG_AT + 1} since diag started" in out["verdict"]
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_detach_with_a_collective_in_flight_is_no_hang(tmp_path):
    """Issue 9: ranks detached at different moments, one inside an all_reduce (rank 0 waits there
    for the slow rank 1), gave "pending-timeout ... op never completed" errors and a CRITICAL
    hang_desync on a healthy job. In-flight ops are unfinished at detach, not errors or evidence."""
    from diag.analyzers import registered_rules

    from diag import load

    trace = tmp_path / "trace"
    launch.run(
        "tests.workloads.gpt_ds",
        [
            "--steps",
            "6",
            "--diag",
            "--trace-dir",
            str(trace),
            "--what",
            "steps,comms",
            "--slow-rank",
            "1",
            "--slow-ms",
            "600",
            "--detach-at",
            "2",
            "--detach-delay",
            "0.3",
        ],
    )
    tr = load(str(trace))
    assert tr.errors.empty, tr.errors.to_dict("records")
    unfinished = {r: h.get(schema.META_UNFINISHED_AT_DETACH) for r, h in tr.headers.items()}
    assert unfinished == {0: 1, 1: 0}, unfinished  # rank 0 was waiting in the gradient all_reduce
    counts = tr.comms.groupby("rank").size().to_dict()
    assert counts[0] < counts[1], counts  # rank 1 detached a step later: its trace has more
    assert registered_rules()["hang_desync"][0](tr) == []


def test_stacks_of_a_healthy_job_give_no_verdict_and_no_diag_frames(tmp_path):
    """Issue 9: on a job training fine `diag stacks` said "at different collective counts" and
    "rank 1 stuck in all_reduce; never arrived: rank 0", and showed diag's own frames."""
    trace = tmp_path / "trace"
    env = launch.job_env({"XDG_RUNTIME_DIR": str(tmp_path)})
    cmd = [
        sys.executable,
        "-m",
        "diag",
        "run",
        "--trace-dir",
        str(trace),
        "--",
        *launch.torchrun_cmd(
            "tests.workloads.megatron_tp", ["--steps", "20000", "--out", str(tmp_path / "out.json")]
        ),
    ]
    job = subprocess.Popen(
        cmd, env=env, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 240  # start-up is slow on a busy 2-core machine
        while (
            len(list(trace.glob("rank-*.jsonl"))) < 2
            or min(f.stat().st_size for f in trace.glob("rank-*.jsonl")) < 10_000
        ):
            assert job.poll() is None and time.monotonic() < deadline, "the job never got going"
            time.sleep(0.5)
        ranks = [pid for pid, _ in ranks_under(job.pid)]  # torchrun starts each in its own session
        res = subprocess.run(
            [sys.executable, "-m", "diag", "stacks", str(job.pid), "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=90,
            env=env,
        )
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["verdict"] is None and out["moving"], out
        shown = [line for g in out["groups"] for line in (*g["describe"], *g["frames"])]
        assert shown and not [x for x in shown if "(timing.py:" in x or "(overflow.py:" in x]
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.wait()


def test_stacks_names_a_collective_issued_from_cpp_with_its_group_and_step(tmp_path):
    """Issue 17: plain DDP's bucket all-reduces come from its C++ reducer, so a rank waiting in one
    shows `backward` on its stack, no collective. With rank 1 SIGSTOPped, rank 0's trace holds the
    all-reduce it issued and never completed (a `comm_open` record, written once it has waited
    `pending.OPEN_S`): `diag stacks` names it, its group and step, and rank 1 as never arrived."""
    trace = tmp_path / "trace"
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    args = ["--steps", "4000", "--hidden", "512", "--log-iterations", "--diag", "--trace-dir", str(trace)]
    job = launch.popen("tests.workloads.ddp", [*args, "--out", str(tmp_path / "r.json")], env=env)
    pids: dict[int | None, int] = {}
    try:
        assert job.stdout is not None
        for line in job.stdout:  # a few iterations trained
            if line.startswith("iteration 5"):
                break
        assert job.poll() is None, "the job ended before training"
        pids = {rank: pid for pid, rank in ranks_under(job.pid)}
        rank0 = str(trace / "rank-00000.jsonl")
        seen = _open_collectives(rank0)  # a healthy call waited in as long under load: not this one
        os.kill(pids[1], signal.SIGSTOP)
        stopped = time.monotonic()
        while _open_collectives(rank0) == seen:  # rank 0's all-reduce waited in past OPEN_S, written
            assert time.monotonic() - stopped < 60, f"no comm_open record in {rank0} after 60 s"
            time.sleep(0.2)
        print(f"\nrank 0's all-reduce on disk as comm_open {time.monotonic() - stopped:.1f} s after SIGSTOP")
        res = subprocess.run(
            [sys.executable, "-m", "diag", "stacks", str(job.pid), "--trace-dir", str(trace), "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=90,
            env=launch.job_env(env),
        )
        assert res.returncode == 0, res.stderr
        found = json.loads(res.stdout)["verdict"] or ""
        assert found.startswith("rank 0 stuck in all_reduce (group world"), found
        assert ", step " in found and "never arrived: rank 1" in found, found
    finally:
        for pid in [job.pid, *pids.values()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.wait()


def _open_collectives(path: str) -> int:
    """`comm_open` records in a rank's trace file: collectives waited in past `pending.OPEN_S` (the
    test slept a fixed 12 s before, past the 10 s after which the agent gives a call up)."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(json.loads(line).get("k") == schema.COMM_OPEN for line in f if line.endswith("\n"))
