"""The training thread's CPU time and run-queue wait, read by the writer thread (never a hook).

A rank that loses the CPU to other processes on its host (an oversubscribed node) is slower on
every step and its peers wait for it: in the trace it is a straggler of its own. The kernel counts
what tells them apart: /proc/<pid>/task/<tid>/schedstat holds the thread's time on a CPU and its
time runnable but waiting for one (run_delay, ns; CONFIG_SCHED_INFO, on in distribution kernels).
The writer thread appends the main thread's two counters with each flush that writes something
(at most every 0.2 s), so the rules interpolate them over any span of steps (the straggler rule:
`cpu_contended`). One /proc read, about 20 us, off the hot path.
"""

from __future__ import annotations

import threading

from diag import schema


class SchedReader:
    """The main (training) thread's schedstat; None once it cannot be read (no such file)."""

    def __init__(self) -> None:
        tid = threading.main_thread().native_id
        self.path: str | None = f"/proc/self/task/{tid}/schedstat" if tid is not None else None

    def record(self, now_ns: int) -> tuple[object, ...] | None:
        """(`sched`, ts, cpu ns, run-queue wait ns), or None where the kernel does not say."""
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                cpu, runq = f.read().split()[:2]
            return (schema.SCHED, now_ns, int(cpu), int(runq))
        except (OSError, ValueError):
            self.path = None
            return None
