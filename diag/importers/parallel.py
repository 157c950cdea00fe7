"""Import Kineto files in worker processes: parsing is CPU-bound Python, one file per rank.

Each worker parses a file and sends back only the compact frames (pickled), so the parsed JSON and
the heap fragmentation it leaves stay in the worker; the main process holds frames only. Small
inputs, or fewer than 3 cores given, are imported in-process (a fork costs more than it saves
there); the pool and its size: `trace.workers`.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Iterator
from typing import Any

from diag.importers.errors import ImportProblem
from diag.trace import workers
from diag.trace.heap import release_memory
from diag.trace.safeio import file_size
from diag.trace.window import ALL, Window

PARALLEL_BYTES = 32 << 20  # total Kineto bytes above which workers are used
DETACH_BYTES = 1 << 20  # a file (compressed or not) at least this big is copied out of its parse
Result = tuple[int, dict[str, Any], dict[str, Any]]


def import_one(path: str, window: Window = ALL, slim: bool = False) -> Result | ImportProblem | None:
    """One file's (rank, header, frames), or the problem; never raises for a malformed file. With a
    window, only its steps' rows, and None for a rank outside it; `slim`: only the host ops analysis
    reads (`kineto.slim_host_ops`). Both cut here, in the worker, so the main process receives
    only what it keeps."""
    from diag.importers.kineto import import_file, slim_host_ops

    try:
        rank, header, frames = import_file(path)
        if window and not window.wants_rank(rank):
            return None
        frames = window.frames(frames) if window else frames
        return rank, header, slim_host_ops(frames) if slim else frames
    except ImportProblem as e:
        return e
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        return ImportProblem(f"malformed trace ({type(e).__name__}: {e})")


def _detached(path: str, window: Window, slim: bool) -> Result | ImportProblem | None:
    """In-process import whose result no longer references the parsed JSON (copied via pickle),
    so the freed parse memory can go back to the OS instead of being pinned by a few strings. A
    small file's parse leaves little to pin: its frames are kept as they are (the copy and the
    trim cost ~6 ms a file, most of a small rank file's import)."""
    if file_size(path) < DETACH_BYTES:
        return import_one(path, window, slim)
    out = pickle.loads(pickle.dumps(import_one(path, window, slim)))
    release_memory()
    return out


def workers_for(paths: list[str]) -> int:
    # leave a core to the main process, which turns results into frames meanwhile; on 2 cores the
    # workers only add fork and pickling costs (measured: same load time, twice the memory)
    return workers.workers_for(paths, PARALLEL_BYTES, min_cores=3, spare=1)


def import_many(
    paths: list[str], window: Window = ALL, slim: bool = False
) -> Iterator[tuple[str, Result | ImportProblem | None]]:
    """(path, result) in input order; None for a file of a rank outside `window`."""
    n = workers_for(paths)
    if n == 0:
        for p in paths:
            yield p, _detached(p, window, slim)
        return
    yield from zip(
        paths, workers.forked_map(functools.partial(import_one, window=window, slim=slim), paths, n)
    )
