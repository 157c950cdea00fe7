"""Several logs of one job (one per node or rank): read in worker processes, their step records
merged as they come.

A log's reading is CPU-bound Python and its result (a few frames) is small, so each file goes to a
worker of its own, up to one per core. The merged `log_step` (one row per iteration, the first figure
any log printed for it, in path order: `merge_parts`) is kept as results arrive, so the main process
holds the run's steps once, not once per log.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator

import pandas as pd

from diag.importers.errors import ImportProblem
from diag.importers.logs import LogImport, first_per_step, import_log
from diag.trace.safeio import file_size

PARALLEL_BYTES = 32 << 20  # total log bytes above which workers are used


def import_one(path: str) -> LogImport | ImportProblem:
    """One log's import, or its problem (returned, not raised: it crosses a process boundary)."""
    try:
        return import_log(path)
    except ImportProblem as e:
        return e


def workers_for(paths: list[str]) -> int:
    if len(paths) < 2 or sum(file_size(p) for p in paths) < PARALLEL_BYTES:
        return 0
    return min(len(paths), os.cpu_count() or 1)


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
    if n <= 1:
        for p in paths:
            yield p, import_one(p)
        return
    # fork: workers start at once with diag imported; one file per task, results in input order
    with multiprocessing.get_context("fork").Pool(n, maxtasksperchild=1) as pool:
        yield from zip(paths, pool.imap(import_one, paths))
