"""Start, watch, release and read the held 2-rank DeepSpeed job (held_job.py) from a test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from tests.workloads import launch

MODULE = "tests.reliability.held_job"
# ZeRO-2, fp16 with a real overflow at step 2: steps, layers, comms, memory and overflow all fire.
# A small model: the job's cost is DeepSpeed's and the agent's, not the matmuls'.
ARGS = [
    "--zero",
    "2",
    "--dtype",
    "fp16",
    "--overflow-at",
    "2",
    "--hidden",
    "32",
    "--layers",
    "1",
    "--seq",
    "16",
    "--vocab",
    "128",
]
MAX_STEPS = 300  # the untouched run's length; every held run's losses are a prefix of it
ATTACH_TIMEOUT_S = 60


class AttachHung(AssertionError):
    """An attach that never returned: the job was killed to end the test."""


def read_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def run_fixed(folder: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run to the end (no release file) and return the result rank 0 wrote."""
    out = os.path.join(folder, "result.json")
    launch.run(MODULE, [*ARGS, *args, "--out", out], env=env)
    return read_json(out)


@dataclass
class Held:
    """A running held job: the torchrun launcher, and the files it is steered by."""

    proc: subprocess.Popen[str]
    folder: str
    env: dict[str, str]

    @property
    def out(self) -> str:
        return os.path.join(self.folder, "result.json")

    def steps(self) -> int:
        try:
            with open(os.path.join(self.folder, "progress")) as f:
                return int(f.read() or 0)
        except FileNotFoundError:
            return 0

    def wait_steps(self, n: int, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while self.steps() < n:
            if self.proc.poll() is not None:
                raise AssertionError(f"job exited {self.proc.returncode}: {self.output()}")
            assert time.monotonic() < deadline, f"job did not reach step {n} in {timeout} s"
            time.sleep(0.05)
        return self.steps()

    def ranks(self) -> list[tuple[int, int | None]]:
        from diag.procs import ranks_under

        deadline = time.monotonic() + 30
        while len(found := ranks_under(self.proc.pid)) != 2:
            assert time.monotonic() < deadline, f"ranks not found under {self.proc.pid}: {found}"
            time.sleep(0.1)
        return found

    def attach(self, **options: Any) -> None:
        """Attach to both ranks in-process, as `diag attach <launcher>` does (saves a CLI start)."""
        from concurrent.futures import ThreadPoolExecutor

        from diag.inject.attach import attach_one

        ranks = self.ranks()
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(attach_one, pid, rank, options, None, True) for pid, rank in ranks]
            try:
                done = [f.result(timeout=ATTACH_TIMEOUT_S) for f in futures]
            except TimeoutError:
                self.kill()  # the tracee's death releases the injector
                raise AttachHung(
                    f"attach did not return in {ATTACH_TIMEOUT_S} s: the ptrace "
                    "injection deadlocked the rank it stopped"
                ) from None
        assert [d.reused for d in done] == [False, False]

    def detach(self) -> None:
        """Detach both ranks, then let two steps pass: a dispatch mode the layers collector pushed
        on the training thread is popped at that thread's next module call (collectors/layers.py)."""
        from diag.control.client import request

        for pid, _ in self.ranks():
            assert request(pid, "detach")["undo_failed"] == []
        self.wait_steps(self.steps() + 2)

    def output(self) -> str:
        if self.proc.stdout is None or self.proc.poll() is None:
            return ""
        return self.proc.stdout.read()[-6000:]

    def finish(self, timeout: float = 120) -> dict[str, Any]:
        """Release the job, wait for a clean exit, return its result."""
        open(os.path.join(self.folder, "release"), "w").close()
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        assert code == 0, f"job exited {code}: {self.output()}"
        return read_json(self.out)

    def kill(self) -> None:
        """SIGKILL the ranks (torchrun starts each in a session of its own) and the launcher."""
        if self.proc.poll() is None:
            from diag.procs import ranks_under

            for pid, _ in ranks_under(self.proc.pid):
                if pid != self.proc.pid:
                    os.kill(pid, signal.SIGKILL)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start(
    folder: str,
    args: list[str] = (),
    env: dict[str, str] | None = None,  # type: ignore[assignment]
    step_sleep: float = 0.1,
) -> Held:
    """Start the held job: it trains up to MAX_STEPS, stopping early once `finish()` releases it."""
    os.makedirs(folder, exist_ok=True)
    own = [
        "--release",
        os.path.join(folder, "release"),
        "--progress",
        os.path.join(folder, "progress"),
        "--out",
        os.path.join(folder, "result.json"),
    ]
    proc = launch.popen(
        MODULE, [*ARGS, "--steps", str(MAX_STEPS), "--step-sleep", str(step_sleep), *own, *args], env=env
    )
    return Held(proc, folder, dict(env or {}))


def assert_same_training(result: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Bit-identical losses on every rank for the steps the job ran, and the same skipped steps."""
    n = len(result["losses"])
    assert 0 < n <= len(baseline["losses"])
    for r in range(2):
        assert result["ranks"][r]["losses"] == baseline["ranks"][r]["losses"][:n], f"rank {r}"
    if n > 2:  # the forced overflow is at step 2
        assert [x["skipped_steps"] for x in result["ranks"]] == [1, 1]


def assert_clean(result: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Nothing of diag left in any rank: threads, fds and hooks as in the untouched run."""
    for r in range(2):
        fp, base = result["ranks"][r]["fingerprint"], baseline["ranks"][r]["fingerprint"]
        assert not fp["agent_running"] and fp["wrapped"] == [], fp
        assert [t for t in fp["threads"] if t.startswith("diag")] == [], fp["threads"]
        for key in ("threads", "fds", "global_hooks", "module_hooks", "profile", "trace"):
            assert fp[key] == base[key], (key, fp[key], base[key])
