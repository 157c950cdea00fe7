"""Importers: diag trace directories, PyTorch profiler (Kineto) traces and training logs -> one `Trace`.

`load_inputs(paths)` detects each input's kind by content. A file that cannot be read becomes a
`LoadProblem` (one line: path and reason) and the other inputs are still loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from diag.errors import DiagError
from diag.importers import detect, runs
from diag.importers.combine import Combiner
from diag.importers.errors import ImportProblem
from diag.trace.model import LoadProblem, Trace
from diag.trace.safeio import file_size
from diag.trace.window import ALL, Window, kineto_rank

Progress = Callable[[str, int], None]  # (path just done, its size in bytes)


def _add_kineto(comb: Combiner, path: str, result: Any) -> None:
    rank, header, frames = result
    if rank in comb.result.headers and comb.result.headers[rank].get("source") == "kineto":
        raise ImportProblem(f"a second Kineto trace for rank {rank} (skipped)")
    for message in header.pop("problems", None) or ():  # kineto.PROBLEMS: imported, with losses
        comb.result.problems.append(LoadProblem(path, message))
    comb.add_header(rank, header)
    comb.add_frames(frames)


def _read(path: str, kind: str, window: Window) -> Any:
    """One non-Kineto input read: a Flight Recorder dump's (rank, header, frames), a diag `Trace` or
    an imported log; None for a dump of a rank outside `window`."""
    if kind == detect.FR:
        from diag.importers.flight_recorder import import_dump

        rank, header, frames = import_dump(path)
        return (rank, header, window.frames(frames)) if window.wants_rank(rank) else None
    if kind == detect.DIAG:
        from diag.trace.reader import Unreadable, load_trace

        try:
            trace = load_trace(path, window=window)
            return trace if trace.headers else None
        except Unreadable as e:
            raise ImportProblem(str(e), e.problems) from None
        except DiagError as e:
            raise ImportProblem(str(e).removeprefix(f"{path}: ")) from None
    from diag.importers.logs import import_log

    return _in_window(import_log(path), window)


def _in_window(log: Any, window: Window) -> Any:
    """An imported log cut to `window`'s ranks and steps (a log is read whole: it has no rank files)."""
    if window:
        log.headers = {r: h for r, h in log.headers.items() if window.wants_rank(r)}
        log.frames = window.frames(log.frames)
    return log


def _add(comb: Combiner, path: str, kind: str, data: Any) -> None:
    if kind == detect.KINETO:
        _add_kineto(comb, path, data)
    elif kind == detect.FR:
        rank, header, frames = data
        if comb.result.headers.get(rank, {}).get("fr_version") is not None:
            raise ImportProblem(f"a second Flight Recorder dump for rank {rank} (skipped)")
        comb.add_header(rank, header)
        comb.add_frames(frames)
    elif kind == detect.DIAG:
        comb.add_trace(data)
    else:
        for rank, header in data.headers.items():
            comb.add_header(rank, header)
        comb.add_frames(data.frames)
        comb.result.problems.extend(data.problems)


def _signature(path: str, kind: str, data: Any) -> runs.RunSig | None:
    if kind == detect.KINETO:
        rank, header, frames = data
        return runs.of_frames(path, kind, {rank: header}, frames)
    if kind == detect.DIAG:
        return runs.of_frames(path, kind, data.headers, data.frames)
    return None  # a log: no identity of its own


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


def _outside(path: str, kind: str, window: Window) -> bool:
    """A Kineto file whose head names a rank outside `window`: skipped unread."""
    return window.ranks is not None and kind == detect.KINETO and not window.wants_rank(kineto_rank(path))


def load_inputs(
    paths: list[str], progress: Progress | None = None, window: Window = ALL, slim: bool = False
) -> Trace:
    """One Trace from every input (only `window`'s ranks and steps); raises `DiagError` only when
    nothing at all could be read, and `runs.MixedRuns` (naming them) when the inputs come from
    different runs. `slim`: only the rows analysis reads (`kineto.slim_host_ops`: a GPU rank's
    host ops), so that memory follows the kernels and collectives, not every host op."""
    from diag.importers.parallel import import_many

    items, problems = input_files(paths)
    comb = Combiner()
    comb.result.problems.extend(problems)
    kinds: dict[str, str] = {}
    for path, kind in items:
        try:
            kinds[path] = kind or detect.kind_of_file(path)
            if _outside(path, kinds[path], window):
                del kinds[path]
        except ImportProblem as e:
            comb.result.problems.append(LoadProblem(path, str(e)))
    loaded: list[tuple[str, str, Any]] = []

    def keep(path: str, kind: str, read: Callable[[], Any]) -> None:
        try:
            data = read()
            if isinstance(data, ImportProblem):
                raise data
            if data is not None:  # None: a rank outside the window
                loaded.append((path, kind, data))
        except ImportProblem as e:
            comb.result.problems.extend(e.problems or [LoadProblem(path, str(e))])
        if progress is not None:
            progress(path, size_of(path))

    for path, result in import_many([p for p, k in kinds.items() if k == detect.KINETO], window, slim):
        keep(path, detect.KINETO, lambda r=result: r)
    logs = [p for p, k in kinds.items() if k == detect.LOG]
    if len(logs) > 1:  # one job's logs: read side by side, their steps merged as they come
        from diag.importers.logs.many import import_logs

        read_logs = dict(import_logs(logs))
    else:
        read_logs = {}
    for path, kind in kinds.items():
        if kind != detect.KINETO:
            keep(
                path,
                kind,
                lambda p=path, k=kind: (
                    _in_window(read_logs[p], window) if p in read_logs else _read(p, k, window)
                ),
            )
    sigs = [s for s in (_signature(*x) for x in loaded) if s is not None]
    found = runs.group(sigs)
    if len(found) > 1:
        raise runs.MixedRuns(found, [p for p, k, _ in loaded if k == detect.LOG])
    for path, kind, data in loaded:
        try:
            _add(comb, path, kind, data)
            comb.result.sources.append(path)
        except ImportProblem as e:
            comb.result.problems.extend(e.problems or [LoadProblem(path, str(e))])
    if not comb.result.sources:
        if not comb.result.problems:
            raise DiagError("nothing to analyze" + (" in the --ranks/--steps window" if window else ""))
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
