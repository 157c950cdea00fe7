"""Several logs of one job (one per node or rank): read in worker processes, their step records
merged as they come.

A log's reading is CPU-bound Python and its result (a few frames) is small, so each file goes to a
worker of its own, up to one per core. The merged `log_step` (one row per iteration, the first figure
any log printed for it, in path order: `merge_parts`) is kept as results arrive, so the main process
holds the run's steps once, not once per log.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

from diag.importers.errors import ImportProblem
from diag.importers.logs import LogImport, first_per_step, import_log
from diag.trace import workers

PARALLEL_BYTES = 32 << 20  # total log bytes above which workers are used


def import_one(path: str) -> LogImport | ImportProblem:
    """One log's import, or its problem (returned, not raised: it crosses a process boundary)."""
    try:
        return import_log(path)
    except ImportProblem as e:
        return e


def workers_for(paths: list[str]) -> int:
    """A worker a core given (the main process only merges the small results)."""
    return workers.workers_for(paths, PARALLEL_BYTES, min_cores=2, spare=0)


def import_logs(paths: list[str]) -> list[tuple[str, LogImport | ImportProblem]]:
    """(path, import or problem) in input order; the first import holds the merged `log_step` of all
    of them, the others none."""
    out: list[tuple[str, LogImport | ImportProblem]] = []
    merged: pd.DataFrame | None = None
    for path, got in _results(paths):
        if isinstance(got, LogImport) and "log_step" in got.frames:
            df = got.frames.pop("log_step")
            merged = df if merged is None else first_per_step([merged, df])
        out.append((path, got))
    first = next((got for _, got in out if isinstance(got, LogImport)), None)
    if first is not None and merged is not None:
        first.frames["log_step"] = merged
    return out


def _results(paths: list[str]) -> Iterator[tuple[str, LogImport | ImportProblem]]:
    n = workers_for(paths)
    if n == 0:
        for p in paths:
            yield p, import_one(p)
        return
    yield from zip(paths, workers.forked_map(import_one, paths, n, per_child=1))
