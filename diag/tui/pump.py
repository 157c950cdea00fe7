"""The worker side of `diag top`: poll the source, aggregate, build the view, run the analyzers
now and then, and post typed messages to the app. Runs on a Textual thread worker; the model is
touched only under `lock` (the UI takes it briefly for a rank's drill-in)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from textual.message import Message

from diag.tui import jobstate
from diag.tui.model import JobModel, trace_of
from diag.tui.view import JobView, build_view

Analyze = Callable[[Any], tuple[list[Any], dict[str, str]]]
# an analysis waits at least this many times its own CPU time after the last one: the rules cost
# 2.4 CPU s at 1,024 ranks x 20 steps (memory_growth, idle_between_steps), every 10 s that was a
# quarter of a core on top of the refreshes
ANALYSIS_SHARE = 10


def run_analyzers(trace: Any) -> tuple[list[Any], dict[str, str]]:
    """`analyzers.run_all` on what has been seen so far (imported lazily: pandas-heavy rules)."""
    from diag.analyzers import run_all

    return run_all(trace)


class ViewUpdated(Message):
    def __init__(self, view: JobView, built_at: float) -> None:
        super().__init__()
        self.view, self.built_at = view, built_at


class FindingsUpdated(Message):
    def __init__(self, findings: list[Any], failures: dict[str, str], error: str | None) -> None:
        super().__init__()
        self.findings, self.failures, self.error = findings, failures, error


class Pump:
    def __init__(
        self,
        source: Any,
        post: Callable[[Message], Any],
        *,
        interval: float,
        analyze: Analyze | None,
        analyze_every: float,
    ) -> None:
        self.source, self.post, self.interval = source, post, interval
        self.analyze, self.analyze_every = analyze, analyze_every
        self.model = JobModel()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.tick_s: list[float] = []  # poll + ingest + build_view, per refresh
        self.analyses = 0
        self._posted = -1
        self._analyzed = -1
        self._last_analysis = float("-inf")
        self._analysis_cpu = 0.0  # thread CPU seconds of the latest analysis
        self.jobstate = jobstate.JobState()
        self._state_at = float("-inf")

    def run(self, cancelled: Callable[[], bool]) -> None:
        """Refresh once per `interval` until stopped (a new view only when something changed); the
        analyses run on a thread of their own, so that refreshes go on while the rules run (2-4 s
        at 1,024 ranks)."""
        if self.analyze is not None:
            threading.Thread(
                target=self._analyses, args=(cancelled,), name="top-analyze", daemon=True
            ).start()
        while not (cancelled() or self.stop.is_set()):
            self.poll_once()
            self.stop.wait(self.interval)

    def _analyses(self, cancelled: Callable[[], bool]) -> None:
        while not (cancelled() or self.stop.is_set()):
            self.maybe_analyze()
            self.stop.wait(self.interval)

    def poll_once(self) -> None:
        t0 = time.perf_counter()
        chunks = self.source.poll()
        state = self._job_state()
        with self.lock:
            self.model.ingest(chunks)
            if state is not None:
                self.model.set_state(state)
            if self.model.version == self._posted:
                return
            self._posted = self.model.version
            view = build_view(self.model)
        self.tick_s.append(time.perf_counter() - t0)
        self.post(ViewUpdated(view, time.monotonic()))

    def _job_state(self) -> str | None:
        """Live sources, every `jobstate.EVERY_S`: whether the job still runs (None: not checked)."""
        now = time.monotonic()
        if not getattr(self.source, "live", False) or now - self._state_at < jobstate.EVERY_S:
            return None
        self._state_at = now
        with self.lock:
            headers = {r: dict(h) for r, h in self.model.headers.items()}
        return self.jobstate.check(headers)

    def maybe_analyze(self) -> None:
        """Every `analyze_every` seconds (or `ANALYSIS_SHARE` times the latest analysis' CPU time,
        if longer) while data changes, and once as soon as a replay ends."""
        now = time.monotonic()
        done = getattr(self.source, "done", False)
        every = max(self.analyze_every, ANALYSIS_SHARE * self._analysis_cpu)
        due = now - self._last_analysis >= every or (done and self.analyses == 0)
        if not (self.analyze and self.model.events and due and self.model.version != self._analyzed):
            return
        cpu0 = time.thread_time()
        self._last_analysis, self._analyzed = now, self.model.version
        with self.lock:  # copied under the lock; frames are built outside it (the UI's drill-in waits)
            snapshot = self.model.snapshot()
        try:
            findings, failures = self.analyze(trace_of(*snapshot))
            error = None
        except Exception as exc:  # noqa: BLE001 - the UI keeps running whatever the analyzers do
            findings, failures, error = [], {}, f"{type(exc).__name__}: {exc}"
        self._analysis_cpu = time.thread_time() - cpu0
        self.analyses += 1
        named = {int(r) for f in findings or [] if getattr(f, "rule", "") == "straggler" for r in f.ranks}
        with self.lock:  # the Ranks tab names the stragglers the Findings tab names
            unchanged = self.model.version == self._analyzed
            self.model.set_stragglers(named)
            if unchanged:  # a verdict is not new data to analyze again
                self._analyzed = self.model.version
        self.post(FindingsUpdated(list(findings or []), dict(failures or {}), error))
