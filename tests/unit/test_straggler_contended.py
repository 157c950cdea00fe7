"""A rank slower on every step because its host's CPU is taken by other processes is not a straggler
of the job's own: the agent samples its training thread's run-queue wait (the kernel's schedstat),
and the straggler rule reports an info finding instead when that wait explains the excess."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from diag.agent.sched import SchedReader
from tests.unit.synth_trace import MS, Job, fired


def _slow_rank1(runq_ms: dict[int, float], steps: int = 10) -> Job:
    """Rank 1 works 60 ms longer a step; rank 0 waits for it in a blocking all-reduce; each rank's
    training thread waited `runq_ms[rank]` for a CPU per step (sampled every 2 steps)."""
    job = Job(steps=steps, step_ms=110)
    for s in range(job.steps):
        job.comm(0, s, at_ms=40, dur_ms=65)
        job.comm(1, s, at_ms=100, dur_ms=5)
    for r in range(2):
        for s in range(-1, job.steps + 2, 2):
            wait = max(0, s) * runq_ms.get(r, 0.0) * MS
            job.add(r, "sched", ts=job.start(r, s), cpu=int(s * 50 * MS), runq=int(wait))
    return job


def test_a_rank_slowed_by_its_hosts_cpu_is_an_info_not_a_straggler(tmp_path):
    (f,) = fired(_slow_rank1({1: 50.0}).write(str(tmp_path / "busy")), "straggler")
    assert f.ranks == [1] and f.severity == "info" and "oversubscribed" in f.title
    assert f.evidence["runq_extra_s"] == pytest.approx(0.050, abs=1e-3)
    # the same excess with no more run-queue wait than its peer (its own work): a straggler
    (g,) = fired(_slow_rank1({0: 5.0, 1: 5.0}).write(str(tmp_path / "own")), "straggler")
    assert g.ranks == [1] and g.severity == "critical"
    # a wait for a CPU that explains under half the excess: still its own
    (h,) = fired(_slow_rank1({1: 25.0}).write(str(tmp_path / "half")), "straggler")
    assert h.severity == "critical"


def test_the_run_queue_wait_of_a_thread_sharing_its_cpu_is_read():
    """This process's main thread, busy for 0.4 s on one CPU beside a busy process pinned to the
    same CPU, waits runnable for about half the time (the kernel shares the CPU between the two)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    reader = SchedReader()
    if reader.record(0) is None:
        pytest.skip("the kernel has no schedstat (CONFIG_SCHED_INFO off)")
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)  # the hog runs
        (_, _, cpu0, runq0), t0 = reader.record(0), time.monotonic()  # type: ignore[misc]
        while time.monotonic() - t0 < 0.4:
            pass
        (_, _, cpu1, runq1), wall = reader.record(0), time.monotonic() - t0  # type: ignore[misc]
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
    waited, ran = (runq1 - runq0) / 1e9, (cpu1 - cpu0) / 1e9
    assert waited >= 0.3 * wall and ran <= 0.7 * wall, (waited, ran, wall)


def test_a_leaking_rank_is_memory_growths_not_a_straggler(tmp_path):
    """A rank that adds 4 MiB a step (the fault matrix's memory-growth cell: allocating and touching
    it is its extra work, 1.3-3.5x the peer's compute) is named by memory_growth; the straggler rule
    leaves it alone. A leak on the other rank changes nothing for the slow one."""

    def leaking(rank: int) -> Job:
        job = _slow_rank1({}, steps=14)
        for r in range(2):
            for s in range(job.steps):
                rss = (256 << 20) + (s * (4 << 20) if r == rank else 0)
                job.add(r, "memory", step=s, ts=job.start(r, s) + 100 * MS, rss=rss)
        return job

    trace = leaking(1).write(str(tmp_path / "slow"))
    assert [f.ranks for f in fired(trace, "memory_growth")] == [[1]]
    assert fired(trace, "straggler") == []
    (f,) = fired(leaking(0).write(str(tmp_path / "other")), "straggler")
    assert f.ranks == [1] and f.severity == "critical"
