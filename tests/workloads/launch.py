"""Launch a workload under torchrun (2 CPU ranks by default) on a free port, with OMP_NUM_THREADS=1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_cmd(module: str, args: list[str], nproc: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        module,
        *args,
    ]


def job_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's env plus OMP_NUM_THREADS=1 and the repo root on PYTHONPATH (tests.workloads)."""
    out = {**os.environ, **(env or {})}
    out["OMP_NUM_THREADS"] = "1"
    path = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = ROOT + (os.pathsep + path if path else "")
    return out


def diag_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """`python -m diag ARGS` from the checkout with the job environment (`job_env`) plus `env`,
    output captured as text unless `kw` says otherwise (the one way the tests run the CLI)."""
    opts: dict[str, Any] = {"capture_output": True, **kw} if not ({"stdout", "stderr"} & set(kw)) else kw
    return subprocess.run(
        [sys.executable, "-m", "diag", *args], text=True, timeout=timeout, cwd=ROOT, env=job_env(env), **opts
    )


def run(
    module: str,
    args: list[str],
    nproc: int = 2,
    timeout: float = 240,
    env: dict[str, str] | None = None,
    diag_run: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run to completion; a non-zero exit raises with every rank's output in the message. `diag_run`:
    a trace directory, to launch under `diag run --trace-dir` (the agent preloaded in every rank)."""
    under = [sys.executable, "-m", "diag", "run", "--trace-dir", diag_run, "--"] if diag_run else []
    proc = subprocess.run(
        [*under, *torchrun_cmd(module, args, nproc)],
        env=job_env(env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{module} {' '.join(args)} exited {proc.returncode}\n"
            f"--- ranks' tracebacks ---\n{rank_errors(proc.stderr)}\n"
            f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
        )
    return proc


def rank_errors(stderr: str, limit: int = 60) -> str:
    """The ranks' own traceback lines (torchrun prefixes them `[rankN]:`), not its summary."""
    lines = [line for line in stderr.splitlines() if line.startswith("[rank")]
    return "\n".join(lines[-limit:])


def popen(
    module: str, args: list[str], nproc: int = 2, env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.Popen[str]:
    """Start in the background (attach tests); the caller waits or kills it. New session, so the
    whole torchrun process tree can be signalled with os.killpg."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.STDOUT)
    return subprocess.Popen(
        torchrun_cmd(module, args, nproc),
        env=job_env(env),
        cwd=ROOT,
        text=True,
        start_new_session=True,
        **kwargs,
    )  # type: ignore[call-overload]
