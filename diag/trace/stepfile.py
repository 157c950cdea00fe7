"""One diag rank file read in two forward passes, for `lockstep` (issue 14).

`load_trace` with a step window keeps every record that carries no step (header, meta, stats,
sched, NVML samples), wherever it lies in the file: a `groups` meta written late renames the
file's earlier collectives, and an `uncaught` meta at the end joins the rank's header. A window
read from the file's front must know them all before its first step is given, so `scan` first
parses every line but the bulky ones the writer starts with a stepped kind (`{"k":"comm"`, ...:
not parsed, about nine lines in ten), and `stepped` then reads the file forward again, parsing only
the lines `scan` left, and yields their (step, line, record), a chunk of lines at a time. Problems
(bad lines, a truncated end, no header) are those `reader.read_file` reports, in its order, once
`stepped` has reached the file's end.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

from diag import schema
from diag.trace import group_members, safeio
from diag.trace.model import LoadProblem
from diag.trace.reader import Problems, group_renames, parse_line, rename_groups, sound_header


def line_prefix(kind: str) -> bytes:
    """The writer's own start of a line of `kind` (`{"k":"comm"`)."""
    return f'{{"k":"{kind}"'.encode()


# the writer's lines of each kind that carries a step: those `scan` does not parse
STEPPED_PREFIXES = tuple(
    line_prefix(k)
    for k in (schema.COMM, schema.LAYER, schema.STEP, schema.MEMORY, schema.OVERFLOW, schema.COMM_OPEN)
)
Record = dict[str, Any]


class OutOfStep(Exception):
    """The trace cannot be read a window at a time without losing or misplacing a record (a record
    of a window already given, one of no step among the stepped lines, a file changed between the
    two passes): the caller reads it whole (`load_trace`) instead."""


def has_step(rec: Record) -> bool:
    """An integer step (not a bool): what `Window.wants_step` filters; any other record is in
    every window."""
    step = rec.get("step")
    return isinstance(step, int) and not isinstance(step, bool)


class StepFile:
    """One rank file: `scan` (its header, rank and step-less records), then `stepped` (the rest)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.header: Record | None = None
        self.still: list[tuple[int, Record]] = []  # (line, record) of no step, in file order
        self.still_by_kind: dict[str, list[tuple[int, Record]]] = {}  # the same, by kind
        self.rank: int | None = None  # None: a sidecar (host samples)
        self.renames: dict[str, str] = {}
        # lines `scan` settled (step-less records, headers, bad lines), ascending: 8 bytes each
        self._settled = array("q")
        self._raw: list[tuple[int, str | None]] = []  # (line, message; None: the truncated end)
        self._lost: list[tuple[int, Record]] = []
        self._records = 0  # records read, kept or not (the truncation message counts them)
        self._error: LoadProblem | None = None
        self._cut: str | None = None  # where a gzip stream breaks mid-file: why (both passes stop there)
        self._unsound: Record | None = None  # a header whose rank, pid or schema is not an integer
        self.problems: list[LoadProblem] | None = None  # set at the file's end
        self._second: Iterator[tuple[int, int, Record]] | None = None

    def scan(self) -> None:
        """The first pass: every line but the writer's stepped ones parsed."""
        try:
            for i, rec in self._lines(first=True):
                if rec["k"] == "header":
                    self.header = self.header or rec
                    self._settled.append(i)
                elif not has_step(rec):
                    self._count(i, rec)
                    self.still.append((i, rec))
                    self._settled.append(i)
        except safeio.GzipCut as e:
            if self.header is None:  # (nothing of the file to keep: as `read_file` says it)
                self._error = LoadProblem(self.path, str(e))
                self.still, self.problems = [], [self._error]
                return
            self._cut = str(e)
        except (safeio.InputError, OSError) as e:
            self._error = LoadProblem(
                self.path, str(e) if isinstance(e, safeio.InputError) else (e.strerror or str(e))
            )
            self.header, self.still = None, []
            self.problems = [self._error]
            return
        if self.header is not None and not sound_header(self.header):
            self._unsound, self.header = self.header, None  # reported at the end, as read_file does

    def _count(self, i: int, rec: Record) -> None:
        self._records += 1
        if rec["k"] == schema.LOST:
            self._lost.append((i, rec))

    def place(self, rank: int | None, merged: Record | None) -> None:
        """The file's rank (None: a sidecar) and its rank's header so far (this file's meta merged
        into it): records get their rank, and its groups' late names (`reader.read_into`)."""
        self.rank = rank
        events = [rec for _, rec in self.still]
        for rec in events:
            rec["rank"] = rank
            if merged is not None and rec["k"] == schema.META and isinstance(rec.get("key"), str):
                merged[rec["key"]] = rec.get("value")
        if merged is not None:
            self.renames = group_renames(merged.get(schema.META_GROUPS))
            rename_groups(events, self.renames)
        for got in self.still:
            self.still_by_kind.setdefault(got[1]["k"], []).append(got)

    def stepped(self) -> Iterator[tuple[int, int, Record]]:
        """The second pass, begun once (`drain` goes on with it)."""
        if self._second is None:
            self._second = self._stepped()
        return self._second

    def _stepped(self) -> Iterator[tuple[int, int, Record]]:
        """The second pass: (step, line, record) of each line `scan` left, in file order, with the
        rank and group names `place` gave; `problems` is set at the end."""
        if self._error is not None:
            return
        fill = group_members.Fill()
        try:
            for i, rec in self._lines(first=False):
                if not has_step(rec) or rec["k"] == schema.META:
                    raise OutOfStep(f"{self.path}:{i}: a record of no step among the stepped lines")
                fill(rec)
                self._count(i, rec)
                rec["rank"] = self.rank
                if self.renames:
                    rename_groups([rec], self.renames)
                yield rec["step"], i, rec
        except safeio.GzipCut:
            pass  # (where the first pass stopped: `_finish` says so)
        except (safeio.InputError, OSError) as e:
            raise OutOfStep(f"{self.path}: {e}") from e
        self.problems = self._finish()

    def drain(self) -> None:
        """The second pass run to the end, its records dropped (a file of no rank wanted: its
        problems still count)."""
        for _ in self.stepped():
            pass

    def _lines(self, first: bool) -> Iterator[tuple[int, Record]]:
        """(line, record) of each line the pass reads (the first: all but the writer's stepped
        lines; the second: those the first left); bad lines noted, too long ones by the first."""
        max_line = safeio.max_line_bytes()
        settled, k = self._settled, 0  # (the second pass: where the first's lines are)
        with safeio.open_lines(self.path) as f:
            for i, (line, ended) in enumerate(safeio.iter_lines(f, max_line), start=1):
                if line is None:
                    if first:
                        self._raw.append(
                            (
                                i,
                                f"skipped a line longer than {max_line:,} bytes "
                                "(DIAG_MAX_LINE_BYTES raises the limit)",
                            )
                        )
                    continue
                if first:
                    if line.startswith(STEPPED_PREFIXES):
                        continue
                else:
                    while k < len(settled) and settled[k] < i:
                        k += 1
                    if k < len(settled) and settled[k] == i:
                        continue
                if not line.strip():
                    continue
                rec, why = parse_line(line)
                if rec is None:
                    if first:
                        settled.append(i)
                    self._raw.append(
                        (
                            i,
                            None
                            if why == "not valid JSON" and not ended
                            else f"skipped a line that is {why}",
                        )
                    )
                    continue
                yield i, rec

    def _finish(self) -> list[LoadProblem]:
        """The file's problems as `reader.read_file` lists them."""
        problems = Problems(self.path)
        for i, message in sorted(self._raw):
            if message is None:
                problems.add(
                    f"truncated after {self._records} events (last line incomplete: "
                    "the process was killed mid-write)",
                    i,
                    truncated=True,
                )
            else:
                problems.add(message, i)
        if self._cut is not None:
            problems.add(f"{self._cut} after {self._records} events", truncated=True)
        header = self.header if self.header is not None else self._unsound
        if header is None:
            problems.add("no header line: not a diag trace file")
        elif not sound_header(header):
            problems.add("header's rank, pid or schema is not an integer: skipped")
        elif int(header.get("schema", 0) or 0) > schema.SCHEMA_VERSION:
            problems.add(f"written by a newer diag (schema {header['schema']}); unknown fields are kept")
        problems.add_lost([rec for _, rec in sorted(self._lost, key=lambda x: x[0])])
        return problems.done()

    def troubled(self) -> bool:
        """A problem is known already (`strict` stops at it)."""
        header = self.header
        newer = header is not None and int(header.get("schema", 0) or 0) > schema.SCHEMA_VERSION
        return bool(self._error or self._cut or self._raw or self._lost or header is None or newer)
