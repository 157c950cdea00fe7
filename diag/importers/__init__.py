"""Importers: diag trace directories, PyTorch profiler (Kineto) traces and training logs -> one `Trace`.

`load_inputs(paths)` detects each input's kind by content. A file that cannot be read becomes a
`LoadProblem` (one line: path and reason) and the other inputs are still loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from diag.errors import DiagError
from diag.importers import detect
from diag.importers.combine import Combiner
from diag.importers.errors import ImportProblem
from diag.trace.model import LoadProblem, Trace
from diag.trace.safeio import file_size

Progress = Callable[[str, int], None]  # (path just done, its size in bytes)


def _kineto(comb: Combiner, path: str, result: object) -> None:
    if isinstance(result, ImportProblem):
        raise result
    rank, header, frames = result  # type: ignore[misc]
    if rank in comb.result.headers and comb.result.headers[rank].get("source") == "kineto":
        raise ImportProblem(f"a second Kineto trace for rank {rank} (skipped)")
    for message in header.pop("problems", None) or ():  # kineto.PROBLEMS: imported, with losses
        comb.result.problems.append(LoadProblem(path, message))
    comb.add_header(rank, header)
    comb.add_frames(frames)


def _one(comb: Combiner, path: str, kind: str) -> None:
    if kind == detect.FR:
        from diag.importers.flight_recorder import import_dump

        rank, header, frames = import_dump(path)
        if comb.result.headers.get(rank, {}).get("fr_version") is not None:
            raise ImportProblem(f"a second Flight Recorder dump for rank {rank} (skipped)")
        comb.add_header(rank, header)
        comb.add_frames(frames)
    elif kind == detect.DIAG:
        from diag.trace.reader import Unreadable, load_trace

        try:
            comb.add_trace(load_trace(path))
        except Unreadable as e:
            raise ImportProblem(str(e), e.problems) from None
        except DiagError as e:
            raise ImportProblem(str(e).removeprefix(f"{path}: ")) from None
    else:
        from diag.importers.logs import import_log

        log = import_log(path)
        for rank, header in log.headers.items():
            comb.add_header(rank, header)
        comb.add_frames(log.frames)
        comb.result.problems.extend(log.problems)


def input_files(paths: list[str]) -> tuple[list[tuple[str, str | None]], list[LoadProblem]]:
    """Every (file or diag dir, kind) under `paths`, plus a problem for each path that has none."""
    items, problems = [], []
    for p in paths:
        try:
            items.extend(detect.expand(p))
        except ImportProblem as e:
            problems.append(LoadProblem(p, str(e)))
    return items, problems


def size_of(path: str) -> int:
    if os.path.isdir(path):
        return sum(file_size(os.path.join(path, f)) for f in os.listdir(path))
    return file_size(path)


def _step(comb: Combiner, path: str, fn: Callable[[Combiner, str], None], progress: Progress | None) -> None:
    try:
        fn(comb, path)
        comb.result.sources.append(path)
    except ImportProblem as e:
        comb.result.problems.extend(e.problems or [LoadProblem(path, str(e))])
    if progress is not None:
        progress(path, size_of(path))


def load_inputs(paths: list[str], progress: Progress | None = None) -> Trace:
    """One Trace from every input; raises `DiagError` only when nothing at all could be read."""
    from diag.importers.parallel import import_many

    items, problems = input_files(paths)
    comb = Combiner()
    comb.result.problems.extend(problems)
    kinds: dict[str, str] = {}
    for path, kind in items:
        try:
            kinds[path] = kind or detect.kind_of_file(path)
        except ImportProblem as e:
            comb.result.problems.append(LoadProblem(path, str(e)))
    kineto = [p for p, k in kinds.items() if k == detect.KINETO]
    for path, result in import_many(kineto):
        _step(comb, path, lambda c, p, r=result: _kineto(c, p, r), progress)
    for path, kind in kinds.items():
        if kind != detect.KINETO:
            _step(comb, path, lambda c, p, k=kind: _one(c, p, k), progress)
    if not comb.result.sources:
        if not comb.result.problems:
            raise DiagError("nothing to analyze")
        from diag.trace.reader import Unreadable

        raise Unreadable(comb.result.problems)
    if sum(k == detect.LOG for k in kinds.values()) > 1:
        from diag.importers.logs import merge_parts

        merge_parts(comb.parts)
    trace = comb.trace()
    if not trace.steps.empty and not trace.frame("log_step").empty:
        from diag.importers.join import join_steps

        trace.frames["step_join"] = join_steps(trace.steps, trace.frame("log_step"), trace.overflow)
    return trace
