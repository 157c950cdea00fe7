"""`diag top` names what `diag watch` names live: a real 2-rank DDP job, rank 1 throttled from outside
(SIGSTOP 40 ms of every 100 ms, the fault matrix's duty cycle), and the TUI's worker (`Pump`, as
`TopApp` runs it: 1 s refreshes, analyses every 10 s) must name rank 1 a straggler stopped from
outside. Before, the TUI never looked at the ranks' processes: its findings never named a throttle."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import pytest

from diag.procs import ranks_under
from tests.integration.faults import INJECT_AFTER, LONG_DDP, Throttle, _follow
from tests.integration.runs import DDP
from tests.workloads import launch

pytestmark = pytest.mark.slow
NAMED_WITHIN_S = 30.0  # the test's patience, not a goal: a quiet machine names it in 2-5 s


def _throttled(findings: list[Any]) -> list[Any]:
    """The straggler findings that name rank 1 as stopped from outside (the process looks' premise)."""
    return [f for f in findings if f.rule == "straggler" and 1 in f.ranks and "stopped_share" in f.evidence]


def test_top_names_a_rank_throttled_from_outside(tmp_path):
    from diag.tui.pump import FindingsUpdated, Pump, run_analyzers
    from diag.tui.source import LiveSource

    trace = str(tmp_path / "trace")
    job = launch.popen(
        DDP,
        [*LONG_DDP, "--log-iterations", "--diag", "--trace-dir", trace, "--out", str(tmp_path / "r.json")],
        env={"XDG_RUNTIME_DIR": str(tmp_path)},
    )
    seen: list[int] = []
    lines: list[str] = []
    threading.Thread(target=_follow, args=(job, seen, lines), daemon=True).start()
    posted: list[Any] = []
    pump: Pump | None = None
    worker: threading.Thread | None = None
    throttle: Throttle | None = None
    pids: dict[int | None, int] = {}
    try:
        deadline = time.monotonic() + 180
        while not seen or max(seen) < INJECT_AFTER:
            assert job.poll() is None, "the job exited before the fault:\n" + "".join(lines[-30:])
            assert time.monotonic() < deadline, "the job never trained"
            time.sleep(0.1)
        pump = Pump(LiveSource(trace), posted.append, interval=1.0, analyze=run_analyzers, analyze_every=10.0)
        worker = threading.Thread(target=pump.run, args=(lambda: False,), name="diag-test-top", daemon=True)
        worker.start()
        pids = {rank: pid for pid, rank in ranks_under(job.pid)}
        time.sleep(3.0)  # the healthy start read and analyzed once
        before = [m for m in posted if isinstance(m, FindingsUpdated)]
        assert before and not any(_throttled(m.findings) for m in before)
        t0 = time.monotonic()
        throttle = Throttle(pids[1])
        named, said = None, []
        while named is None and time.monotonic() - t0 < NAMED_WITHIN_S:
            time.sleep(0.2)
            said = [m for m in posted if isinstance(m, FindingsUpdated)]
            named = next((m for m in said if _throttled(m.findings)), None)
        assert named is not None, [(f.rule, f.ranks, f.severity, f.title) for m in said for f in m.findings]
        (f,) = _throttled(named.findings)
        assert f.severity in ("warning", "critical") and f.evidence["resumes"] >= 3, f
        print(f"named {time.monotonic() - t0:.1f} s after the throttle began: {f.title} ({f.severity})")
    finally:
        if throttle is not None:
            throttle.stop()
        if pump is not None:
            pump.stop.set()
        if worker is not None:
            worker.join(timeout=30)
        for pid in [job.pid, *pids.values()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.wait()
