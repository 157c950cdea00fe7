"""Load a trace directory: tolerant of killed jobs (a truncated last line), unknown fields, and
older schema versions. Never raises for one bad file when others are readable: each problem is kept
in `Trace.problems` and the CLI prints them one line each.
"""

from __future__ import annotations

import glob
import os
import re
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from diag import schema
from diag.errors import DiagError
from diag.trace import group_members, safeio, values
from diag.trace.model import CATEGORICAL, LoadProblem, Trace
from diag.trace.window import ALL, Window, diag_file_rank

if TYPE_CHECKING:  # imported where frames are built (`diag top` and the exporter tail without it)
    import pandas as pd

# gpu-<host>.jsonl: the NVML sidecar's file (a header with "sidecar": "nvml", then `gpu` events)
# proc-<host>.jsonl: `diag watch`'s looks at each rank's process ("sidecar": "watch", `proc` events)
# each plain or gzipped (`gzip rank-*.jsonl` archives a trace; `safeio.open_lines` reads by content)
SUFFIXES = (".jsonl", ".jsonl.gz")
RANK_GLOB = tuple(f"rank-*{s}" for s in SUFFIXES)
TRACE_GLOB = tuple(f"{kind}-*{s}" for kind in ("rank", "pid", "gpu", "proc") for s in SUFFIXES)
MAX_LINE_PROBLEMS = 20  # bad lines reported one by one per file; the rest are counted
_CAPTURE = re.compile(r"^rank-\d+\.(\d+)\.jsonl(?:\.gz)?$")  # `writer.open_private`'s later capture


class Unreadable(DiagError):
    """Nothing at all could be read: `str()` is the first problem; `problems` holds every one, and
    `per_file()` one line per bad file for the commands to print."""

    def __init__(self, problems: list[LoadProblem]) -> None:
        super().__init__(str(problems[0]))
        self.problems = problems

    def per_file(self) -> list[LoadProblem]:
        """One problem per file, in order: why the file as a whole was not read (no header, not a
        regular file) before any of its lines' problems."""
        best: dict[str, LoadProblem] = {}
        for p in self.problems:
            if p.path not in best or (best[p.path].line is not None and p.line is None):
                best[p.path] = p
        return list(best.values())


def parse_line(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """One JSON line -> (record, None), or (None, why it was skipped). Shared with the live tailer
    (diag/tui/tail.py), which feeds it complete lines as they are appended."""
    try:
        obj = values.loads(line)
        why = values.problem(obj) if isinstance(obj, dict) else None
        if why is not None:  # read again as the stdlib reads it: the reason it names stands
            obj = values.loads(line, exact=True)
            why = values.problem(obj) if isinstance(obj, dict) else None
    except values.BadValue as e:
        return None, f"a record that {e}"
    except (ValueError, UnicodeDecodeError):
        return None, "not valid JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get("k"), str):
        return None, "not a diag record"
    if why is not None:
        return None, f"a record that {why}"
    return obj, None


def trace_files(path: str) -> list[str]:
    """The per-rank files of a trace directory (or the one file given); a directory holding a file
    both plain and gzipped is refused (`gzip_twins`)."""
    if not os.path.exists(path):
        raise DiagError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        return [path]  # read_file refuses what is not a regular file, with the reason
    files = matching(path, TRACE_GLOB)
    if not files:
        raise DiagError(f"{path}: no diag trace files (rank-*.jsonl) in this directory")
    twice = gzip_twins(files)
    if twice:  # read both, every record of the file counted twice; either alone, a guess
        name = os.path.basename(twice[0])
        raise DiagError(
            f"{path}: holds {name[:-3]} and {name}, {TWINS}: move one of them out of the directory"
        )
    return files


TWINS = "one file plain and gzipped (gzip -k?)"


def gzip_twins(files: list[str]) -> list[str]:
    """The gzipped files of `files` whose plain file is there too (`gzip -k` keeps it)."""
    names = set(files)
    return [f for f in files if f.endswith(".gz") and f[:-3] in names]


def matching(path: str, patterns: tuple[str, ...]) -> list[str]:
    """The files of directory `path` that match any of `patterns`, sorted."""
    return sorted({f for pat in patterns for f in glob.glob(os.path.join(path, pat))})


def capture_of(file: str) -> tuple[int, str]:
    """(which capture: 0 the first, K its `.K` file; the name): captures in the order they came."""
    m = _CAPTURE.match(os.path.basename(file))
    return (int(m.group(1)) if m else 0, file)


def capture_numbers(path: str) -> list[int]:
    """The captures a diag trace directory holds, oldest first: an attach to a rank that already
    has a file in it writes `rank-N.K.jsonl` (the K-th after the first). Read as one trace, two
    attaches' steps collided (a new user's reused `./diag-trace`: 1,640 all_reduce calls a rank
    under 856 steps, silently)."""
    return sorted({capture_of(f)[0] for f in matching(path, RANK_GLOB)})


def captures(path: str) -> int:
    """How many capture windows a diag trace directory holds (`capture_numbers`)."""
    return len(capture_numbers(path))


def of_capture(files: list[str], capture: int) -> list[str]:
    """The files of one capture: its rank files, and the sidecars (gpu-, proc-, pid-: their names
    carry no capture a host's dots could not fake), which every capture keeps."""
    return [f for f in files if capture_of(f)[0] == capture or not os.path.basename(f).startswith("rank-")]


class ManyCaptures(DiagError):
    """A directory of several captures read with none named: the line says how to name one (`pick`:
    the Python API's keyword here, a command's option where a command reads it)."""

    def __init__(self, path: str, held: list[int], pick: str = "diag.load(path, capture=K)") -> None:
        super().__init__(
            f"{path} holds {len(held)} captures (rank-N.jsonl, rank-N.1.jsonl ...): "
            f"read one with {pick}, K one of {', '.join(map(str, held))}"
        )
        self.path, self.held = path, held


def capture_files(path: str, capture: int | None) -> list[str]:
    """`trace_files` of one capture: refused, with how to pick one, where `path` holds several and
    none was named (read as one trace, their steps collide)."""
    if capture is not None and (type(capture) is not int):  # (a string from argv named a capture held)
        raise DiagError(f"capture must be an integer (0 the first capture), got {capture!r}")
    files = trace_files(path)
    held = capture_numbers(path) if os.path.isdir(path) else []
    if capture is None:
        if len(held) > 1:
            raise ManyCaptures(path, held)
        return files
    wanted = of_capture(files, capture)
    if not any(os.path.basename(f).startswith("rank-") for f in wanted):
        raise DiagError(f"{path}: no capture {capture} (it holds {', '.join(map(str, held)) or 'none'})")
    return wanted


Take = Callable[[dict[str, Any] | None, list[dict[str, Any]]], bool]
CHUNK = 20_000  # a file's records held as dicts at most (about 1 KB each) before `take` gets them
# (16 ranks x 1,000 steps: the load peaks at 264 MiB RSS with 20,000, 350 with 100,000, same CPU)
# the kinds that grow with the steps, each of one set of fields and types (the others, meta's values
# of every type above all, stay dicts to the file's end: one file's records, one frame, as before)
TAKEN_KINDS = (schema.COMM, schema.LAYER, schema.STEP, schema.MEMORY)


def read_file(
    path: str, window: Window = ALL, take: Take | None = None, chunk: int = CHUNK
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[LoadProblem]]:
    """One rank file -> (header, events, problems). A bad last line is a truncation, not an error.
    Streams the file line by line (lines longer than `safeio.max_line_bytes()` are skipped), so
    memory follows the records kept, not the file's size; only regular files are opened. A record
    of a step outside `window` is dropped as it is read: a window of a long job holds its steps'
    records only. With `take`, every `chunk` records kept are offered to it with the header seen so
    far; those it takes (True) are not returned: a long rank file is not held whole as dicts."""
    problems = Problems(path)
    header: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    read = 0  # records read, kept or not
    lost: list[dict[str, Any]] = []  # reported whatever their step
    fill = group_members.Fill()
    max_line = safeio.max_line_bytes()
    try:
        with safeio.open_lines(path) as f:
            for i, (line, ended) in enumerate(safeio.iter_lines(f, max_line), start=1):
                if line is None:
                    problems.add(
                        f"skipped a line longer than {max_line:,} bytes "
                        "(DIAG_MAX_LINE_BYTES raises the limit)",
                        i,
                    )
                    continue
                if not line.strip():
                    continue
                obj, why = parse_line(line)
                if obj is None:
                    if why == "not valid JSON" and not ended:
                        problems.add(
                            f"truncated after {read} events (last line incomplete: "
                            "the process was killed mid-write)",
                            i,
                            truncated=True,
                        )
                    else:
                        problems.add(f"skipped a line that is {why}", i)
                    continue
                if obj["k"] == "header":
                    header = header or obj
                else:
                    read += 1
                    fill(obj)
                    if obj["k"] == schema.LOST:
                        lost.append(obj)
                    if window.wants_step(obj.get("step")):
                        events.append(obj)
                        if take is not None and len(events) >= chunk and take(header, events):
                            events = []
    except safeio.GzipCut as e:  # (what was read before the break stands, as a cut plain file's)
        if header is None:
            return None, [], [LoadProblem(path, str(e))]
        problems.add(f"{e} after {read} events", truncated=True)
    except (safeio.InputError, OSError) as e:
        return (
            None,
            [],
            [LoadProblem(path, str(e) if isinstance(e, safeio.InputError) else (e.strerror or str(e)))],
        )
    if header is None:
        problems.add("no header line: not a diag trace file")
    elif not sound_header(header):
        problems.add("header's rank, pid or schema is not an integer: skipped")
        header = None
    elif int(header.get("schema", 0) or 0) > schema.SCHEMA_VERSION:
        problems.add(f"written by a newer diag (schema {header['schema']}); unknown fields are kept")
    problems.add_lost(lost)
    return header, events, problems.done()


class Problems:
    """One file's problems: each bad line up to `MAX_LINE_PROBLEMS`, then one count of the rest,
    so a file of a million bad lines gives a bounded report (and bounded memory)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.items: list[LoadProblem] = []
        self.more = 0
        self.first_more: int | None = None

    def add(self, message: str, line: int | None = None, truncated: bool = False) -> None:
        if line is not None and not truncated and len(self.items) >= MAX_LINE_PROBLEMS:
            self.more += 1
            self.first_more = self.first_more or line
            return
        self.items.append(LoadProblem(self.path, message, line, truncated))

    def add_lost(self, events: list[dict[str, Any]]) -> None:
        """The writer's own record of lines it could not write (disk full): reported, not hidden."""
        for ev in events:
            if ev.get("k") == schema.LOST:
                self.items.append(LoadProblem(self.path, lost_message(ev)))

    def done(self) -> list[LoadProblem]:
        if self.more:
            self.items.append(LoadProblem(self.path, f"skipped {self.more} more bad lines", self.first_more))
        return self.items


def lost_message(ev: dict[str, Any]) -> str:
    """`12 lines lost while writing the trace (ENOSPC), steps 40-52`."""
    first, last = ev.get("first_step"), ev.get("last_step")
    steps = "" if first is None else f", step {first}" if first == last else f", steps {first}-{last}"
    return f"{ev.get('lines')} lines lost while writing the trace ({ev.get('error') or 'write error'}){steps}"


def _frame(kind: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    return _finish(kind, pd.DataFrame.from_records(rows))


def _finish(kind: str, df: pd.DataFrame) -> pd.DataFrame:
    """A kind's records as read (one frame, every rank) -> its frame: schema defaults, categoricals,
    rows by rank and time."""
    for col in ("rank", *schema.FIELDS.get(kind, ())):
        if col not in df.columns:
            df[col] = schema.DEFAULTS.get(col)
    import pandas as pd

    if "k" in df.columns:  # (a dropped copy shares the columns: sorted, the frame's held twice)
        df = df.drop(columns=["k"])
    if kind == schema.COMM:
        _bandwidths(df)
    for col in CATEGORICAL:
        # pandas 3 reads text as `str` (StringDtype), not object: both become categoricals
        if col in df.columns and (df[col].dtype == object or isinstance(df[col].dtype, pd.StringDtype)):
            try:
                df[col] = df[col].astype("category")
            except TypeError:  # unhashable values (lists) stay objects
                pass
    if "ts" in df.columns:
        df = by_rank_and_time(df)
    return df


def by_rank_and_time(df: pd.DataFrame) -> pd.DataFrame:
    """`df.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)`, where the rows are
    in that order already (a rank file's calls: written in time order) without sorting, and
    otherwise one column at a time: `sort_values` held the whole frame and its sorted copy at once
    (a 64-rank x 1,000-step trace's layer frame: +67 MiB at the load's end, docs/scale.md)."""
    import numpy as np
    import pandas as pd

    rank, ts = df["rank"].to_numpy(), df["ts"].to_numpy()
    if _numbers(rank) and _numbers(ts):  # no value missing: a stable lexsort is the same order
        if _in_order(rank, ts):
            return df.reset_index(drop=True)
        order = np.lexsort((ts, rank))  # (pandas factorizes each key first: +70 bytes a row)
    else:
        keys = pd.DataFrame({"rank": df["rank"].array, "ts": df["ts"].array})  # a range index
        order = keys.sort_values(["rank", "ts"], kind="stable").index.to_numpy()
        del keys
    del rank, ts
    if bool((order == np.arange(len(order))).all()):
        return df.reset_index(drop=True)
    out = {}
    for col in list(df.columns):  # each column's old rows freed before the next is taken
        taken = df.pop(col)
        out[col] = pd.Series(taken.array.take(order), name=col, copy=False)
        del taken
    return pd.DataFrame(out, copy=False)


def _numbers(values: Any) -> bool:
    """A numpy column of numbers, none of them NaN."""
    import numpy as np

    return values.dtype.kind in "iu" or (values.dtype.kind == "f" and not bool(np.isnan(values).any()))


def _in_order(rank: Any, ts: Any) -> bool:
    """Rows of numbers in (rank, ts) order (ties kept as they are)."""
    if len(rank) < 2:
        return True
    same = rank[1:] == rank[:-1]
    ordered = rank[1:] > rank[:-1]
    ordered |= same & (ts[1:] >= ts[:-1])
    return bool(ordered.all())


def _bandwidths(df: pd.DataFrame) -> None:
    """The writer's derived `algbw` / `busbw` where the records lack them (a trace written by
    another tool, or trimmed by hand), as the agent derives them (`schema.bandwidths`): without them
    every bandwidth table stopped the analysis with a KeyError."""
    if "algbw" in df.columns and "busbw" in df.columns:
        return
    import pandas as pd

    def num(col: str) -> pd.Series:
        return pd.to_numeric(df[col], errors="coerce").fillna(0)

    # no op recorded (pandas 3 keeps a missing text NaN through `astype(str)`): factor 1
    ops = (op if isinstance(op, str) else "" for op in df["op"])
    both = [
        schema.bandwidths(*call) for call in zip(ops, num("bytes"), num("dur"), num("group_size").astype(int))
    ]
    alg, bus = zip(*both) if both else ((), ())
    if "algbw" not in df.columns:
        df["algbw"] = list(alg)
    if "busbw" not in df.columns:
        df["busbw"] = list(bus)


def load_trace(path: str, *, strict: bool = False, window: Window = ALL, capture: int | None = None) -> Trace:
    """Read every rank file under `path` into a `Trace`. With `strict`, any problem is an error.
    With `capture`, only that capture's files (`capture_files`: a directory of several needs one).
    With a `window`, a rank-NNNNN.jsonl of another rank is not opened, other ranks' records and
    steps outside it are dropped (no rank of `path` in the window: a Trace without headers).

    Each file's records become columns (`perfile.PerFile`) before the next file is read, so memory
    holds one file's parsed records at a time, not the job's (a record as a dict is about 10x its
    row in a frame); where the files' columns disagree in a way only a joint reading settles, the
    files are read again and their records joined whole, as before."""
    from diag.trace.perfile import PerFile, Uneven

    try:
        return _load(path, strict, window, PerFile(), capture)
    except Uneven:
        return _load(path, strict, window, None, capture)


def _load(path: str, strict: bool, window: Window, per_file: Any, capture: int | None = None) -> Trace:
    """`load_trace` with each file's records turned into columns as read (`per_file`: in worker
    processes where the files are many and big, `rankfiles`), or held until every file is read
    (None)."""
    trace = Trace(sources=[path])
    files = capture_files(path, capture)
    wanted = [f for f in files if not named_outside(f, window)]
    skipped = len(files) - len(wanted)
    if per_file is not None:
        from diag.trace.rankfiles import read_each

        skipped += read_each(trace, wanted, window, per_file, read_into)
    else:
        by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        skipped += sum(read_into(trace, file, window, by_kind, None) for file in wanted)
    if strict and trace.problems:
        raise DiagError(str(trace.problems[0]))
    if not trace.headers:
        if skipped and not trace.problems:
            return trace  # every rank outside the window
        raise Unreadable(trace.problems or [LoadProblem(path, "no readable trace")])
    trace.frames = (
        per_file.frames(_finish) if per_file is not None else build_frames(by_kind, trace.problems, path)
    )
    from diag.trace import step_align

    step_align.align(trace)  # (steps each rank counted from its own attach: one numbering)
    return trace


def named_outside(file: str, window: Window) -> bool:
    """A rank-NNNNN.jsonl of a rank outside `window`: not opened."""
    named = diag_file_rank(file) if window.ranks is not None else None
    return named is not None and not window.wants_rank(named)


def read_into(
    trace: Trace, file: str, window: Window, by_kind: dict[str, list[dict[str, Any]]], per_file: Any
) -> bool:
    """One file read into `trace` (its rank's merged header, its problems) and its records into
    `by_kind`, or, with `per_file`, into its frames (`by_kind` left empty); True where the file is
    of a rank outside `window` (dropped)."""
    taken = _Taken(trace, by_kind, per_file, window) if per_file is not None else None
    header, events, problems = read_file(file, window, taken.take if taken else None, CHUNK)
    trace.problems.extend(problems)
    if header is None:
        return False
    if header.get("sidecar"):  # host-level samples (NVML, the watcher's looks): no rank header
        for ev in events:
            ev["rank"] = None
            by_kind[ev["k"]].append(ev)
        _add_file(per_file, by_kind)
        return False
    rank = header.get("rank")
    if rank is None:  # started before the process group: the rank came later, as meta
        rank = next(
            (
                ev.get("value")
                for ev in events
                if ev.get("k") == schema.META and ev.get("key") == "rank" and is_int(ev.get("value"))
            ),
            None,
        )
    if rank is None:
        rank = -int(header.get("pid") or 0)  # unknown rank: keep it apart, keyed by pid
    if window.ranks is not None and not window.wants_rank(rank):
        return True
    merged = _add_events(trace, rank, header, events, by_kind)
    renames = group_renames(merged.get(schema.META_GROUPS))
    rename_groups(events, renames)
    if taken is not None and taken.mark is not None:
        per_file.rename(schema.COMM, "group", renames, taken.mark)  # its records taken already
    _add_file(per_file, by_kind)
    return False


def _add_file(per_file: Any, by_kind: dict[str, list[dict[str, Any]]]) -> None:
    """The file's records left in `by_kind` into its frames, with `per_file`."""
    if per_file is not None and by_kind:
        per_file.add(by_kind)


def _add_events(
    trace: Trace,
    rank: int,
    header: dict[str, Any],
    events: list[dict[str, Any]],
    by_kind: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """The rank's events into `by_kind`, its meta into its merged header (returned)."""
    merged = trace.headers.setdefault(rank, dict(header))
    for ev in events:
        ev["rank"] = rank
        by_kind[ev["k"]].append(ev)
        if ev["k"] == schema.META and isinstance(ev.get("key"), str):
            merged[ev["key"]] = ev.get("value")
    return merged


class _Taken:
    """A long rank file's records turned into columns a chunk at a time (`read_file`'s `take`),
    where its header already names its rank; `mark` is where its frames begin in `per_file` (None
    while none was taken). A file whose rank comes later (as meta) or is outside the window, or a
    sidecar's, is held whole as before."""

    def __init__(self, trace: Trace, by_kind: dict[str, Any], per_file: Any, window: Window) -> None:
        self.trace, self.by_kind, self.per_file, self.window = trace, by_kind, per_file, window
        self.mark: dict[str, int] | None = None

    def take(self, header: dict[str, Any] | None, events: list[dict[str, Any]]) -> bool:
        if header is None or header.get("sidecar") or not sound_header(header):
            return False
        rank = header.get("rank")
        if rank is None or (self.window.ranks is not None and not self.window.wants_rank(rank)):
            return False
        if self.mark is None:
            self.mark = self.per_file.mark()
        _add_events(self.trace, rank, header, events, self.by_kind)
        self.per_file.add({kind: self.by_kind.pop(kind) for kind in TAKEN_KINDS if kind in self.by_kind})
        return True


def group_renames(groups: Any) -> dict[str, str]:
    """{group id: name} of the groups the agent named by their role only after their first
    collectives (`renamed` in the `groups` meta: collectors.comms.groups)."""
    if not isinstance(groups, dict):
        return {}
    return {
        k: v["renamed"]
        for k, v in groups.items()
        if isinstance(v, dict) and isinstance(v.get("renamed"), str)
    }


def rename_groups(events: list[dict[str, Any]], renames: dict[str, str]) -> None:
    """A renamed group carries its name in this rank's earlier records too."""
    if renames:
        for ev in events:
            if ev["k"] == schema.COMM and ev.get("group") in renames:
                ev["group"] = renames[ev["group"]]


def sound_header(header: dict[str, Any]) -> bool:
    """A header whose rank, pid and schema are integers (or absent): one `read_file` keeps."""
    return all(is_int(header.get(f)) for f in ("rank", "pid", "schema"))


def is_int(value: Any) -> bool:
    """None (absent) or a real integer: header fields a corrupt or hostile file may get wrong."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def build_frames(
    by_kind: dict[str, list[dict[str, Any]]], problems: list[LoadProblem] | None = None, path: str = ""
) -> dict[str, pd.DataFrame]:
    """Records (each with its "rank") grouped by kind -> one frame per kind; also used by the TUI
    to build a `Trace` from what it has tailed so far. Given `problems`, a kind whose records have
    fields of the wrong type (a corrupt file) is skipped and reported there instead of raising."""
    out = {}
    for kind, rows in by_kind.items():
        if not rows:
            continue
        try:
            out[kind] = _frame(kind, rows)
        except (TypeError, ValueError) as e:
            if problems is None:
                raise
            problems.append(
                LoadProblem(path, f"{kind} records skipped: a field has the wrong type ({type(e).__name__})")
            )
    return out
