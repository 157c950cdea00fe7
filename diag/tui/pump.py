"""The worker side of `diag top`: poll the source, aggregate, build the view, run the analyzers
now and then, and post typed messages to the app. Runs on a Textual thread worker; the model is
touched only under `lock` (the UI takes it briefly for a rank's drill-in).

A live job's ranks on this host are looked at as `diag watch` does (`diag.live.looks`: a thread
every 20 ms, the analyses reading each rank's process fact), so the Findings tab names a rank
throttled from outside, stopped or dead as the watch does. The looks are not written to the trace
directory (`proc-<host>.jsonl` has one writer, `diag watch`: two followers would write two files of
the same looks, counted twice post-mortem)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from textual.message import Message

from diag.live.looks import Looks, alarming, news
from diag.tui import jobstate
from diag.tui.model import JobModel, trace_of
from diag.tui.view import JobView, build_view

Analyze = Callable[[Any], tuple[list[Any], dict[str, str]]]
# an analysis waits at least this many times its own CPU time after the last one: the rules cost
# 2.4 CPU s at 1,024 ranks x 20 steps (memory_growth, idle_between_steps), every 10 s that was a
# quarter of a core on top of the refreshes
ANALYSIS_SHARE = 10
# while a rank's process is stopped, gone or stopped and resumed lately (`looks.alarming`), an
# analysis every refresh, at most this many times its CPU time apart (`diag watch`'s PACE: a third of
# a core), so that a hang, a dead or a throttled rank is named within seconds, as the watch names it
ALARM_SHARE = 2


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
        # the ranks' processes (a live job's; what a replay's headers name is not the job's)
        self.looks = Looks() if analyze is not None and getattr(source, "live", False) else None
        self._news: tuple[tuple[int, str, bool], ...] = ()  # the looks the latest analysis read

    def run(self, cancelled: Callable[[], bool]) -> None:
        """Refresh once per `interval` until stopped (a new view only when something changed); the
        analyses run on a thread of their own, so that refreshes go on while the rules run (2-4 s
        at 1,024 ranks)."""
        if self.analyze is not None:
            threading.Thread(
                target=self._analyses, args=(cancelled,), name="top-analyze", daemon=True
            ).start()
        with self.looks.following(lambda: self.model.headers) if self.looks else contextlib.nullcontext():
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

    def caught_up(self, shown: JobView | None) -> bool:
        """Whether `shown` (the app's view) is built from the model as it is now and the latest
        analysis read that model: nothing is left to show until the source gives more. Tests wait
        for it before a snapshot (the analysis' straggler marks come one refresh after it)."""
        with self.lock:
            version, analyzed, analyses = self.model.version, self._analyzed, self.analyses
        return shown is not None and analyses > 0 and shown.version == version == analyzed

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
        if longer) while data changes, and once as soon as a replay ends; every refresh (at most
        `ALARM_SHARE` times its CPU time apart) while a rank's process is stopped, gone or
        throttled, or when the looks changed what the rules read."""
        now = time.monotonic()
        done = getattr(self.source, "done", False)
        facts = {} if self.looks is None else self.looks.look(dict(self.model.headers))
        every = max(self.analyze_every, ANALYSIS_SHARE * self._analysis_cpu)
        if alarming(facts):
            every = max(self.interval, ALARM_SHARE * self._analysis_cpu)
        due = now - self._last_analysis >= every or (done and self.analyses == 0)
        fresh = self.model.version != self._analyzed or news(facts) != self._news
        if not (self.analyze and self.model.events and due and fresh):
            return
        cpu0 = time.thread_time()
        self._last_analysis, self._analyzed, self._news = now, self.model.version, news(facts)
        with self.lock:  # copied under the lock; frames are built outside it (the UI's drill-in waits)
            snapshot = self.model.snapshot()
        try:
            trace = trace_of(*snapshot)
            if self.looks is not None:
                findings, failures = self.looks.analyze(trace, facts, self.analyze)
            else:
                findings, failures = self.analyze(trace)
            error = None
        except Exception as exc:  # noqa: BLE001 - the UI keeps running whatever the analyzers do
            findings, failures, error = [], {}, f"{type(exc).__name__}: {exc}"
        self._analysis_cpu = time.thread_time() - cpu0
        named = {int(r) for f in findings or [] if getattr(f, "rule", "") == "straggler" for r in f.ranks}
        with self.lock:  # the Ranks tab names the stragglers the Findings tab names
            unchanged = self.model.version == self._analyzed
            self.model.set_stragglers(named)
            if unchanged:  # a verdict is not new data to analyze again
                self._analyzed = self.model.version
            self.analyses += 1  # counted with its verdict in the model (`caught_up`)
        self.post(FindingsUpdated(list(findings or []), dict(failures or {}), error))
