"""`diag top` names what `diag watch` names live: a real 2-rank DDP job and the TUI's worker (`Pump`,
as `TopApp` runs it: 1 s refreshes, analyses every 10 s) following its trace directory. Rank 1
throttled from outside (SIGSTOP 40 ms of every 100 ms, the fault matrix's duty cycle) must be named a
straggler stopped from outside; rank 1 killed (torchrun then ends rank 0 too) must be named the rank
that died. Before, the TUI never looked at the ranks' processes: it never named a throttle, and read
a killed rank only from its trace."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from diag.procs import ranks_under
from tests.integration.faults import INJECT_AFTER, LONG_DDP, Throttle, _follow
from tests.integration.runs import DDP
from tests.workloads import launch

pytestmark = pytest.mark.slow
PATIENCE_S = 30.0  # the test's patience, not a goal: a quiet machine names either in 1-3 s


@contextlib.contextmanager
def _top_on_a_job(tmp_path: Any) -> Iterator[tuple[list[Any], dict[int | None, int], Any]]:
    """A training DDP job followed by the pump from its healthy start: (findings posted, rank pids,
    the pump)."""
    from diag.tui.pump import Pump, run_analyzers
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
        while pump.analyses == 0:  # the healthy start read and analyzed once
            assert time.monotonic() < deadline, "the pump never analyzed the healthy start"
            time.sleep(0.1)
        yield posted, pids, pump
    finally:
        if pump is not None:
            pump.stop.set()
        if worker is not None:
            worker.join(timeout=30)
        for pid in [job.pid, *pids.values()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.wait()


def _said(posted: list[Any], test: Callable[[Any], bool], since: int = 0) -> Any:
    """The first finding posted after message `since` that passes `test`, waiting up to PATIENCE_S."""
    from diag.tui.pump import FindingsUpdated

    t0 = time.monotonic()
    while time.monotonic() - t0 < PATIENCE_S:
        said = [f for m in posted[since:] if isinstance(m, FindingsUpdated) for f in m.findings]
        hit = next((f for f in said if test(f)), None)
        if hit is not None:
            print(f"named {time.monotonic() - t0:.1f} s after the fault: {hit.title} ({hit.severity})")
            return hit
        time.sleep(0.2)
    analyses = [m for m in posted[since:] if isinstance(m, FindingsUpdated)]
    raise AssertionError(
        f"{len(analyses)} analyses posted in {PATIENCE_S:.0f} s, none named it: findings "
        f"{[(f.rule, f.ranks, f.severity, f.title) for f in said]}, errors "
        f"{[m.error for m in analyses if m.error]}, rules failed "
        f"{[m.failures for m in analyses if m.failures]}"
    )


def _stopped_from_outside(f: Any) -> bool:
    return f.rule == "straggler" and 1 in f.ranks and "stopped_share" in f.evidence


@pytest.fixture(scope="module")
def top(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Any], dict[int | None, int], Any]]:
    """One job and pump for both tests, in their order: the throttle (stopped at its test's end, rank
    1 running again), then the kill, which ends the job. A job each cost a start and a healthy
    first analysis more, training on both cores all along."""
    with _top_on_a_job(tmp_path_factory.mktemp("top")) as found:
        yield found


def test_top_names_a_rank_throttled_from_outside(top):
    posted, pids, _ = top
    assert posted and not any(_stopped_from_outside(f) for m in posted for f in getattr(m, "findings", []))
    throttle = Throttle(pids[1])
    try:
        f = _said(posted, _stopped_from_outside)
    finally:
        throttle.stop()
    assert f.severity in ("warning", "critical") and f.evidence["resumes"] >= 3, f


def test_top_names_the_rank_that_died_first(top):
    """torchrun ends rank 0 within a moment of rank 1's SIGKILL: the looks every 20 ms saw rank 1
    gone, killed, while rank 0 ran, so the analysis names rank 1 alone. Only where torchrun reaped
    rank 1 before any look (its monitor polls every 0.1 s; the looker wakes when the rank ends, a
    few ms on a loaded host) is its status unseen: a death then proves nothing, and nothing may be
    named of it but rank 1."""
    posted, pids, pump = top
    since = len(posted)
    os.kill(pids[1], signal.SIGKILL)
    try:
        f = _said(posted, lambda f: f.rule == "job_crash", since)
    except AssertionError:
        deaths = pump.looks.deaths
        if 1 in deaths.exits:
            raise
        crash = [f for m in posted[since:] for f in getattr(m, "findings", []) if f.rule == "job_crash"]
        assert not crash, crash
        pytest.skip(f"torchrun reaped rank 1 before any look: its exit status unseen ({deaths.exits})")
    assert f.ranks == [1] and f.severity == "critical", f
