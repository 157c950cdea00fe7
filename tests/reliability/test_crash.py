"""Crash safety: SIGKILL at random (seeded) points leaves every trace loadable up to its last flushed
event, and the loader flags a cut last line as a truncation (`trace.truncated`), nothing else.

20 kills of an agent under load (forked from one server, so each costs a fraction of a second), the
same check on byte-level cuts of a finished file, and 2 kills of a rank of the real DeepSpeed job."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from diag import load
from diag.trace.reader import read_file, trace_files
from tests.reliability import jobs
from tests.workloads import launch

SEED = 7
TRIALS = 20


def check_trace(trace_dir: str) -> tuple[int, int]:
    """Every file loads exactly its complete lines; only a cut last line is reported, as truncated.
    Returns (events loaded, files cut mid-line)."""
    total = cut = 0
    for path in trace_files(trace_dir):
        with open(path, "rb") as f:
            raw = f.read()
        complete = raw[: raw.rfind(b"\n") + 1].splitlines()
        tail = raw[raw.rfind(b"\n") + 1 :]
        if tail.endswith(b"}"):  # cut just before its newline: the record itself is whole
            complete, raw = [*complete, tail], raw + b"\n"
        header, events, problems = read_file(path)
        assert header == json.loads(complete[0])
        assert events == [json.loads(line) for line in complete[1:]], path
        if raw.endswith(b"\n"):
            assert problems == [], [str(p) for p in problems]
        else:
            cut += 1
            assert len(problems) == 1 and problems[0].truncated, [str(p) for p in problems]
        total += len(events)
    trace = load(trace_dir)
    assert len(trace.truncated) == cut == len(trace.problems)
    return total, cut


@pytest.fixture(scope="module")
def fork_server() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.crash_target"],
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=launch.job_env(),
        cwd=launch.ROOT,
    )
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


def _kill_one(server: subprocess.Popen[str], trace_dir: str, delay: float) -> int:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(trace_dir + "\n")
    server.stdin.flush()
    line = server.stdout.readline()
    assert line.startswith("pid "), line
    time.sleep(delay)
    os.kill(int(line.split()[1]), signal.SIGKILL)
    status = server.stdout.readline().split()
    return int(status[1])


def test_sigkill_under_load_twenty_seeded_trials(tmp_path, fork_server) -> None:
    rng = random.Random(SEED)
    events, cuts = [], 0
    for i in range(TRIALS):
        trace_dir = str(tmp_path / f"t{i}")
        status = _kill_one(fork_server, trace_dir, rng.uniform(0.1, 0.8))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        n, cut = check_trace(trace_dir)
        events.append(n)
        cuts += cut
    print(
        f"\n{TRIALS} SIGKILLs: {min(events)}-{max(events)} events kept per trace, "
        f"{cuts} traces cut mid-line (reported as truncated)"
    )
    assert max(events) > 1000  # the kills landed under load, not only at start-up


def test_cut_at_any_byte_loads_the_complete_lines(tmp_path, fork_server) -> None:
    """A SIGKILL inside a multi-page write leaves a prefix of it: every prefix is safe to load."""
    src = str(tmp_path / "src")
    _kill_one(fork_server, src, 1.0)
    (path,) = trace_files(src)
    with open(path, "rb") as f:
        raw = f.read()
    first = raw.index(b"\n") + 1  # keep the header: without it the file is not a trace at all
    assert len(raw) > first, "no events flushed in 1 s"
    rng = random.Random(SEED)
    offsets = [rng.randrange(first, len(raw)) for _ in range(TRIALS)]
    for n, offset in enumerate(offsets):
        d = tmp_path / f"cut{n}"
        d.mkdir()
        (d / os.path.basename(path)).write_bytes(raw[:offset])
        check_trace(str(d))
        shutil.rmtree(d)


def _wait_flushed_step(path: str, timeout: float = 30.0) -> None:
    """Until the victim's writer has flushed at least one step record: the kill then lands after a
    known flushed event, whatever the machine's load (the writer flushes every 0.2 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and b'"k":"step"' in open(path, "rb").read():
            return
        time.sleep(0.05)
    raise AssertionError(f"no step record flushed to {path} within {timeout} s")


@pytest.mark.slow
@pytest.mark.parametrize("trial", [0, 1])
def test_sigkill_of_a_real_rank(tmp_path, trial) -> None:
    rng = random.Random(SEED * 100 + trial)
    victim, at_step = rng.choice([0, 1]), rng.randint(2, 6)
    trace = str(tmp_path / "trace")
    held = jobs.start(
        str(tmp_path / "job"),
        ["--diag", "--trace-dir", trace, "--layers-every", "1"],
        step_sleep=rng.uniform(0.0, 0.1),
    )
    try:
        held.wait_steps(at_step)
        _wait_flushed_step(os.path.join(trace, f"rank-{victim:05d}.jsonl"))
        pid = dict((r, p) for p, r in held.ranks())[victim]
        os.kill(pid, signal.SIGKILL)
        assert held.proc.wait(timeout=120) != 0
    finally:
        held.kill()
    check_trace(trace)
    steps = load(trace).steps
    mine = sorted(steps[steps["rank"] == victim]["step"])
    # what was flushed, in order, numbered as DeepSpeed counts steps (its global_steps, from 1)
    assert mine == list(range(1, len(mine) + 1)) and len(mine) >= 1
