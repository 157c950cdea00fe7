"""The exporter's loop: tail the trace directory, aggregate, run the rules now and then, serve.

One poll thread owns the reading (every `interval` s) and the rules (every `analyze_every` s, on
what has been read so far, as `diag top` does); a scrape builds the families under the same lock
from the aggregates alone, so a scrape costs O(ranks x collectives), never a re-read.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from diag.exporter.families import families
from diag.tui.model import JobModel, trace_of
from diag.tui.source import LiveSource, capture_note
from diag.tui.view import build_view

Analyze = Callable[[Any], tuple[list[Any], dict[str, str]]]


def run_analyzers(trace: Any) -> tuple[list[Any], dict[str, str]]:
    from diag.analyzers import run_all  # pandas-heavy: imported on the first analysis only

    return run_all(trace)


class Exporter:
    """A prometheus-client collector over one trace directory (register it on a registry)."""

    def __init__(
        self,
        trace_dir: str,
        job: str,
        *,
        interval: float = 2.0,
        analyze_every: float = 60.0,
        analyze: Analyze | None = run_analyzers,
    ) -> None:
        self.source = LiveSource(trace_dir)
        self.job, self.interval = job, interval
        self.analyze_every, self.analyze = analyze_every, analyze
        self.model = JobModel()
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.findings: dict[tuple[str, str], int] | None = None  # None until the rules ran once
        self.analysis_error: str | None = None
        self._analyzed_version = -1
        self._last_analysis = float("-inf")
        self._thread: threading.Thread | None = None
        self._capture = 0  # the capture the exporter said it follows

    def poll_once(self) -> int:
        chunks = self.source.poll()
        self._say_capture()
        with self.lock:
            return self.model.ingest(chunks)

    def _say_capture(self) -> None:
        """One line on stderr when the directory holds several captures (a later attach's
        `rank-N.K.jsonl`) and whenever a newer one appears: its metrics are the newest's alone."""
        tail = self.source.tail
        if tail.capture != self._capture:
            self._capture = tail.capture
            print(
                f"diag export: note: {tail.directory} holds several captures: {capture_note(tail)}",
                file=sys.stderr,
            )

    def maybe_analyze(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if (
            self.analyze is None
            or self.analyze_every <= 0
            or not self.model.events
            or now - self._last_analysis < self.analyze_every
            or self.model.version == self._analyzed_version
        ):
            return
        self._last_analysis = now
        with self.lock:  # only the copy holds scrapes back; frames are built outside
            self._analyzed_version = self.model.version
            snapshot = self.model.snapshot()
        try:
            found, _failures = self.analyze(trace_of(*snapshot))
            self.findings = dict(Counter((f.rule, f.severity) for f in found))
            self.analysis_error = None
        except Exception as exc:  # noqa: BLE001 - the exporter keeps serving whatever the rules do
            self.analysis_error = f"{type(exc).__name__}: {exc}"

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.poll_once()
            self.maybe_analyze()
            self.stop_event.wait(self.interval)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="diag-export-poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            view = build_view(self.model)
            out = list(families(self.model, view, self.job, self.findings))
        yield from out


def registry_for(exporter: Exporter) -> CollectorRegistry:
    """A registry holding only the job's metrics (no process metrics of the exporter itself)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return registry
