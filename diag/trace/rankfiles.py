"""diag's own rank files read in worker processes, so `diag analyze` uses the cores it is given.

Each worker reads one file as the reader does in-process (`reader.read_into`: its problems, its
rank's header merged with its meta, its records turned into frames by `PerFile.add`, a chunk at a
time) and sends back only that: the compact frames and a few KiB of header and problems; the parsed
records and the heap they fragment stay in the worker. The main process takes the files' results in
file order, so the frames, problems and headers are those of the in-process reading. A file of a
rank an earlier file already gave (a restarted rank's pid- file, a rank learnt from meta) merges its
meta into what is known of that rank, which may rename its groups: it is read again, in-process.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from diag.trace import workers
from diag.trace.model import LoadProblem, Trace
from diag.trace.perfile import PerFile, Uneven
from diag.trace.window import Window

PARALLEL_BYTES = 32 << 20  # total bytes of rank files above which workers are used (as Kineto's)
# the main process only waits and joins: a worker a core, none left spare; but on 2 cores two
# workers did not measurably beat the in-process reading (same wall and CPU, the tree's PSS +11% at
# 16 ranks x 1,000 steps: docs/scale.md), so 2 cores read in-process, as for Kineto
MIN_CORES, SPARE = 3, 0


@dataclass
class FileRead:
    """One file as `reader.read_into` leaves it, read alone."""

    headers: dict[int, dict[str, Any]]  # its rank's merged header (none: a sidecar, a bad file)
    problems: list[LoadProblem]
    parts: dict[str, list[Any]]  # `PerFile.parts` of this file
    skipped: bool  # a rank outside the window


# `reader.read_into` (given by the reader, which imports this module): (trace, file, window, the
# file's records by kind, per_file) -> whether the file is of a rank outside the window
ReadInto = Callable[[Trace, str, Window, dict[str, list[dict[str, Any]]], PerFile], bool]


def read_alone(file: str, window: Window, read_into: ReadInto) -> FileRead | None:
    """One file read into a trace and frames of its own (in a worker); None where its columns
    cannot be joined file by file (`Uneven`: the reader then reads every file together)."""
    trace, per_file = Trace(), PerFile()
    try:
        skipped = read_into(trace, file, window, defaultdict(list), per_file)
    except Uneven:
        return None
    return FileRead(trace.headers, trace.problems, per_file.parts, skipped)


def read_each(trace: Trace, files: list[str], window: Window, per_file: PerFile, read_into: ReadInto) -> int:
    """Every file read into `trace` and `per_file`, in order; how many were of ranks outside `window`."""
    n = workers.workers_for(files, PARALLEL_BYTES, MIN_CORES, SPARE)
    if n == 0:
        return sum(read_into(trace, f, window, defaultdict(list), per_file) for f in files)
    skipped = 0
    results = workers.forked_map(functools.partial(read_alone, window=window, read_into=read_into), files, n)
    try:
        for file, got in zip(files, results):
            if got is None:
                raise Uneven(file)
            if any(rank in trace.headers for rank in got.headers):  # its meta joins an earlier file's
                skipped += read_into(trace, file, window, defaultdict(list), per_file)
                continue
            trace.headers.update(got.headers)
            trace.problems.extend(got.problems)
            per_file.extend(got.parts)
            skipped += got.skipped
    finally:
        results.close()  # ends the workers now, also when a file was Uneven
    return skipped
