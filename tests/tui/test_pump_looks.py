"""The TUI's worker looks at a live job's ranks as `diag watch` does: a rank's process stopped is news
the next refresh analyzes (not `analyze_every` later), with each rank's process fact in the trace
the rules read; the same looks twice over unchanged data ask for no analysis."""

from __future__ import annotations

import signal
import time
from typing import Any

from tests.unit.test_watch import _ranks_as_processes


def _until_stopped(pid: int) -> None:
    """Until /proc says the process is stopped (a signal is delivered a moment after it is sent)."""
    from diag.inject.checks import status_fields

    for _ in range(500):
        if (status_fields(pid) or {}).get("State", "").startswith("T"):
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never stopped")


def test_a_stopped_rank_is_analyzed_at_the_next_refresh(tmp_path):
    from diag.live.looks import QUIET  # running, sleeping or in a disk wait: not stopped
    from diag.tui.pump import Pump
    from diag.tui.source import LiveSource

    procs = _ranks_as_processes(str(tmp_path))
    read: list[dict[int, Any]] = []

    def analyze(trace: Any) -> tuple[list[Any], dict[str, str]]:
        read.append({r: dict(h.get("process") or {}) for r, h in trace.headers.items()})
        return [], {}

    try:
        pump = Pump(LiveSource(str(tmp_path)), [].append, interval=0.01, analyze=analyze, analyze_every=60)
        pump.poll_once()
        pump.maybe_analyze()
        assert len(read) == 1 and {read[0][r]["state"] for r in (0, 1)} <= set(QUIET)
        pump._last_analysis -= 1.0  # a refresh later: nothing new, nothing stopped
        pump.maybe_analyze()
        assert len(read) == 1
        procs[1].send_signal(signal.SIGSTOP)
        _until_stopped(procs[1].pid)
        pump._last_analysis -= 1.0
        pump.maybe_analyze()  # no new record, analyze_every 60 s: analyzed all the same
        assert len(read) == 2 and read[1][1]["state"] == "T" and read[1][0]["state"] in QUIET
        assert read[1][1]["named"] is False and read[1][1]["stopped_share"] > 0
        pump._last_analysis -= 1.0
        pump.maybe_analyze()  # the same looks over the same data: not again
        assert len(read) == 2
    finally:
        for p in procs:
            p.kill()
            p.wait()
