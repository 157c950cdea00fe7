"""`diag run`'s preloaded sitecustomize: which processes are launchers (never given an agent), and the
launcher's one line at exit when no rank of the job started the agent (it used to exit 0 silently)."""

from __future__ import annotations

import os
import sys

import pytest

from diag.inject.site.sitecustomize import launcher
from tests.workloads import launch

PY = "/usr/bin/python3"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([PY, "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"], True),
        ([PY, "-u", "-m", "torch.distributed.launch", "train.py"], True),
        ([PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "train.py"], True),
        ([PY, "/venv/bin/torchrun", "--nproc_per_node=2", "train.py"], True),
        ([PY, "-X", "importtime", "/venv/bin/deepspeed", "train.py"], True),
        (["/opt/bin/torchrun", "train.py"], True),
        # the public DDP tutorial's own script: its ranks were taken for launchers, no agent started
        ([PY, "-u", "/src/ddp-tutorial-series/multigpu_torchrun.py", "5", "3"], False),
        ([PY, "train.py", "--launcher", "torchrun"], False),
        ([PY, "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"], False),
        ([PY, "-m", "torch.distributed.runner_of_mine"], False),
        ([PY, "/venv/bin/accelerate", "launch", "train.py"], True),
        ([PY, "-m", "accelerate.commands.launch", "train.py"], True),
    ],
)
def test_a_launcher_is_the_program_a_process_runs_not_a_word_in_it(argv: list[str], expected: bool) -> None:
    assert launcher(argv) is expected


JOB = "import os, time; time.sleep(0.2); print('rank', os.environ['RANK'], 'done')\n"


def _run(tmp_path, script: str, worker: list[str], body: str = JOB) -> tuple[int, str, list[str]]:
    path = tmp_path / script
    path.write_text(body)
    trace = tmp_path / "trace"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=1",
        f"--master_port={launch.free_port()}",
    ]
    proc = launch.diag_cli("run", "--trace-dir", str(trace), "--", *cmd, *worker, str(path), timeout=120)
    files = os.listdir(trace) if trace.exists() else []
    return proc.returncode, proc.stderr, files


def test_a_rank_whose_script_is_named_like_a_launcher_gets_the_agent(tmp_path) -> None:
    rc, err, files = _run(tmp_path, "multigpu_torchrun.py", [])
    assert rc == 0 and "rank-00000.jsonl" in files, (files, err[-2000:])
    assert "no process of this job started the diag agent" not in err


def test_the_launcher_says_so_when_no_rank_started_the_agent(tmp_path) -> None:
    """A worker run with `python -S` (no site, so no sitecustomize): the job runs, nothing is recorded,
    and the launcher's exit says it in one line instead of a silent exit 0."""
    rc, err, files = _run(tmp_path, "train.py", ["--no-python", sys.executable, "-S"])
    assert rc == 0 and not files
    lines = [line for line in err.splitlines() if "no process of this job started the diag agent" in line]
    assert len(lines) == 1 and str(tmp_path / "trace") in lines[0], err[-2000:]


def test_the_single_process_a_launcher_runs_without_rank_gets_the_agent(tmp_path) -> None:
    """`accelerate launch` with one process runs `python train.py` with no RANK: the agent went into
    accelerate itself (0 steps) and the training process had none. A direct child of the launcher
    `diag run` ran is a rank; the launcher is not (no trace of its own)."""
    import stat

    fake = tmp_path / "accelerate"  # a launcher by name: runs the script as its one child, no RANK
    child = "sys.exit(subprocess.call([sys.executable, sys.argv[-1]]))"
    fake.write_text(f"#!{sys.executable}\nimport subprocess, sys\n{child}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\nopt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n"
        "for _ in range(3):\n    opt.step()\n"
    )
    trace = tmp_path / "trace"
    proc = launch.diag_cli(
        "run", "--trace-dir", str(trace), "--", str(fake), "launch", str(train), timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(os.listdir(trace)) == 1  # one trace: the child's, none for the launcher
    import diag

    t = diag.load(str(trace))
    (header,) = t.headers.values()
    assert header["argv"][-1] == str(train) and len(t.steps) == 3, (header["argv"], t.steps)


def test_a_python_subprocess_of_a_rank_gets_no_agent(tmp_path) -> None:
    """DeepSpeed runs `python cpuinfo.py --json` from each rank, RANK inherited: each became a second
    trace file claiming the rank (`rank-00000.1.jsonl`) and paid the agent's start. A subprocess with
    another RANK is a rank of its own and still gets one."""
    probe = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'print(1)'], check=True)\n"
    other = (
        "import os, subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(0.3)'],"
        " env={**os.environ, 'RANK': '7'}, check=True)\n"
    )
    rc, err, files = _run(tmp_path, "train.py", [], probe + other + JOB)
    assert rc == 0 and sorted(files) == ["rank-00000.jsonl", "rank-00007.jsonl"], (files, err[-2000:])


def test_versions_imported_after_the_agent_started_reach_the_header(tmp_path) -> None:
    """Under `diag run` the agent starts before the job imports torch or megatron: the header said
    null for both on Megatron-LM's run_simple_mcore_train_loop.py (known under attach), and the
    framework detection did not see megatron-core. They are written once imported."""
    pytest.importorskip("megatron.core", reason="megatron-core is the `train` extra")
    import megatron.core
    import torch

    import diag

    body = "import time, megatron.core  # noqa\ntime.sleep(1.0)\n"
    rc, err, files = _run(tmp_path, "train.py", [], body)
    assert rc == 0 and "rank-00000.jsonl" in files, (files, err[-2000:])
    header = diag.load(str(tmp_path / "trace")).headers[0]
    assert header["megatron"] == megatron.core.__version__ and header["torch"] == torch.__version__, header
