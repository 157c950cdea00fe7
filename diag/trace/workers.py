"""How many worker processes a read of many rank files may use, and the forked pool they run in.

Shared by the Kineto import (`importers.parallel`) and the reader of diag's own traces
(`trace.rankfiles`): parsing is CPU-bound Python, one file per rank, so `diag analyze` uses the
cores it is given (its affinity: a Slurm step's or `taskset`'s cores, not the machine's), at most
`MAX_WORKERS`, or `DIAG_WORKERS` (0: read in-process).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable
from typing import TypeVar

from diag.trace.safeio import plain_size

MAX_WORKERS = 4  # a worker's peak (one file parsed) adds to the tree's memory: more cost more
ENV = "DIAG_WORKERS"
T = TypeVar("T")
R = TypeVar("R")


def cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS says it, else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this OS
        return os.cpu_count() or 1


def user_cap() -> int | None:
    """`DIAG_WORKERS`: the most workers the user allows (0: none); None where unset or not a whole
    number >= 0 (then the default policy)."""
    try:
        value = int(os.environ.get(ENV, "").strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def workers_for(paths: list[str], min_bytes: int, min_cores: int, spare: int) -> int:
    """Workers for reading `paths`: none for one file, for under `min_bytes` in all (a fork and the
    frames' pickling cost more than they save there; a gzipped file counted uncompressed, its work)
    or with fewer than `min_cores` cores; else one a core, less `spare` cores left to the main
    process, at most `MAX_WORKERS` and `DIAG_WORKERS`."""
    cap = user_cap()
    if cap == 0 or len(paths) < 2:
        return 0
    given = cores()
    if given < min_cores or sum(plain_size(p) for p in paths) < min_bytes:
        return 0
    n = min(len(paths), given - spare, MAX_WORKERS if cap is None else cap)
    return n if n >= 1 else 0


def forked_map(
    fn: Callable[[T], R], items: Iterable[T], n: int, per_child: int = 4
) -> Generator[R, None, None]:
    """`map(fn, items)` in `n` forked workers, results in input order. fork: workers start in
    milliseconds with diag already imported; a fresh worker every `per_child` files bounds the heap
    fragmentation one worker accumulates. Closing the iterator early ends the workers."""
    import multiprocessing  # here: an in-process read never pays for importing it

    with multiprocessing.get_context("fork").Pool(n, maxtasksperchild=per_child) as pool:
        yield from pool.imap(fn, items)
