"""The training thread's CPU time and run-queue wait, read by the writer thread (never a hook).

A rank that loses the CPU to other processes on its host (an oversubscribed node) is slower on
every step and its peers wait for it: in the trace it is a straggler of its own. The kernel counts
what tells them apart: /proc/<pid>/task/<tid>/schedstat holds the thread's time on a CPU and its
time runnable but waiting for one (run_delay, ns; CONFIG_SCHED_INFO, on in distribution kernels).
The writer thread appends the main thread's two counters with each flush that writes something
(at most every 0.5 s: `FLUSH_INTERVAL_S`), so the rules interpolate them over any span of steps (the
straggler rule: `cpu_contended`). The file is held open and re-read with one `pread`: opening it each flush (a
Python file object: open, fstat, ioctl, read, close) cost ~80 us of the writer's CPU a flush in
bench/overhead's job, a third of the flush.
"""

from __future__ import annotations

import os
import threading

from diag import schema


class SchedReader:
    """The main (training) thread's schedstat; None once it cannot be read (no such file)."""

    def __init__(self) -> None:
        tid = threading.main_thread().native_id
        self.path: str | None = f"/proc/self/task/{tid}/schedstat" if tid is not None else None
        self.fd: int | None = None

    def record(self, now_ns: int) -> tuple[object, ...] | None:
        """(`sched`, ts, cpu ns, run-queue wait ns), or None where the kernel does not say."""
        if self.path is None:
            return None
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            cpu, runq = os.pread(self.fd, 256, 0).split()[:2]
            return (schema.SCHED, now_ns, int(cpu), int(runq))
        except (OSError, ValueError):
            self.close()
            self.path = None
            return None

    def close(self) -> None:
        """Release the descriptor (the agent's stop, a forked child's copy)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
