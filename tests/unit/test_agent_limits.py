"""The agent's limits: bounded memory with a stalled writer, a full disk, crash-safe lines."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

import pytest

import diag
from diag import agent, schema
from diag.agent.options import DEFAULTS

MEMORY_CAP_BYTES = 64 << 20  # documented cap for the default ring (README: "Agent limits")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _stall_writer(ag) -> None:
    ag._stop.set()
    ag._flush_now.set()
    ag._thread.join()


def test_ten_million_events_with_stalled_writer_stay_under_cap(tmp_path):
    ag = agent.start(str(tmp_path), what=("steps",))
    _stall_writer(ag)
    before = _rss()
    emit, now = ag.emit, time.perf_counter_ns
    for i in range(10_000_000):
        emit((schema.COMM, i, "all_reduce", 4096, "float32", "pg0", 2, None, now(), 1000, None, False))
    grown = _rss() - before
    assert len(ag.ring) == DEFAULTS.ring_capacity
    assert ag.ring.dropped["comm"] == 10_000_000 - DEFAULTS.ring_capacity
    assert grown < MEMORY_CAP_BYTES, f"agent grew {grown / 2**20:.1f} MiB"
    agent.stop()
    stats = diag.load(str(tmp_path)).stats.iloc[-1]
    assert stats["dropped"]["comm"] == 10_000_000 - DEFAULTS.ring_capacity
    assert stats["captured"]["comm"] == DEFAULTS.ring_capacity


@pytest.fixture
def tiny_tmpfs():
    mnt = tempfile.mkdtemp(prefix="diag-enospc-")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], capture_output=True, text=True
    )
    if res.returncode != 0:
        os.rmdir(mnt)
        pytest.skip(
            reason=f"cannot mount a small tmpfs here (needs root / CAP_SYS_ADMIN): {res.stderr.strip()}"
        )
    yield mnt
    subprocess.run(["umount", mnt], check=False)
    os.rmdir(mnt)


def test_disk_full_never_raises_and_is_reported(tiny_tmpfs):
    ag = agent.start(tiny_tmpfs, what=("steps",))
    for i in range(20_000):  # ~2 MB of JSON into a 64 kB filesystem
        ag.emit((schema.STEP, i, ag.now(), 1000, 8, None, True))
    ag.flush()
    deadline = time.monotonic() + 10
    while ag.status()["lines_lost"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    status = ag.status()
    assert status["lines_lost"] > 0 and status["write_error"] == "ENOSPC"
    agent.stop()
    tr = diag.load(tiny_tmpfs)  # what fitted is still readable
    assert len(tr.steps) > 0
