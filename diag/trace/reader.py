"""Load a trace directory: tolerant of killed jobs (a truncated last line), unknown fields, and
older schema versions. Never raises for one bad file when others are readable: each problem is kept
in `Trace.problems` and the CLI prints them one line each.
"""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from typing import Any

import pandas as pd

from diag import schema
from diag.errors import DiagError
from diag.trace.model import CATEGORICAL, LoadProblem, Trace

# gpu-<host>.jsonl: the NVML sidecar's file (a header with "sidecar": "nvml", then `gpu` events)
TRACE_GLOB = ("rank-*.jsonl", "pid-*.jsonl", "gpu-*.jsonl")


def parse_line(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """One JSON line -> (record, None), or (None, why it was skipped). Shared with the live tailer
    (diag/tui/tail.py), which feeds it complete lines as they are appended."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None, "not valid JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get("k"), str):
        return None, "not a diag record"
    return obj, None


def trace_files(path: str) -> list[str]:
    """The per-rank files of a trace directory (or the one file given)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise DiagError(f"{path}: no such file or directory")
    files = sorted({f for pat in TRACE_GLOB for f in glob.glob(os.path.join(path, pat))})
    if not files:
        raise DiagError(f"{path}: no diag trace files (rank-*.jsonl) in this directory")
    return files


def read_file(path: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[LoadProblem]]:
    """One rank file -> (header, events, problems). A bad last line is a truncation, not an error."""
    problems: list[LoadProblem] = []
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        return None, [], [LoadProblem(path, e.strerror or str(e))]
    lines = raw.split(b"\n")
    ends_clean = raw.endswith(b"\n")
    header: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        obj, why = parse_line(line)
        if obj is None:
            if why == "not valid JSON" and i == last and not ends_clean:
                problems.append(LoadProblem(path, f"truncated after {len(events)} events (last "
                                            "line incomplete: the process was killed mid-write)",
                                            line=i + 1, truncated=True))
            else:
                problems.append(LoadProblem(path, f"skipped a line that is {why}", i + 1))
            continue
        if obj["k"] == "header":
            header = header or obj
        else:
            events.append(obj)
    if header is None:
        problems.append(LoadProblem(path, "no header line: not a diag trace file"))
    elif not all(_is_int(header.get(f)) for f in ("rank", "pid", "schema")):
        problems.append(LoadProblem(path, "header's rank, pid or schema is not an integer: skipped"))
        header = None
    elif int(header.get("schema", 0) or 0) > schema.SCHEMA_VERSION:
        problems.append(LoadProblem(path, f"written by a newer diag (schema {header['schema']}); "
                                    "unknown fields are kept"))
    return header, events, problems


def _frame(kind: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(rows)
    for col in ("rank", *schema.FIELDS.get(kind, ())):
        if col not in df.columns:
            df[col] = schema.DEFAULTS.get(col)
    df = df.drop(columns=["k"], errors="ignore")
    for col in CATEGORICAL:
        if col in df.columns and df[col].dtype == object:
            try:
                df[col] = df[col].astype("category")
            except TypeError:  # unhashable values (lists) stay objects
                pass
    if "ts" in df.columns:
        df = df.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)
    return df


def load_trace(path: str, *, strict: bool = False) -> Trace:
    """Read every rank file under `path` into a `Trace`. With `strict`, any problem is an error."""
    trace = Trace(sources=[path])
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for file in trace_files(path):
        header, events, problems = read_file(file)
        trace.problems.extend(problems)
        if header is None:
            continue
        if header.get("sidecar"):  # host-level samples (NVML): not a rank, no rank header
            for ev in events:
                ev["rank"] = None
                by_kind[ev["k"]].append(ev)
            continue
        rank = header.get("rank")
        if rank is None:  # started before the process group: the rank came later, as meta
            rank = next((ev.get("value") for ev in events if ev.get("k") == schema.META
                         and ev.get("key") == "rank" and _is_int(ev.get("value"))), None)
        if rank is None:
            rank = -int(header.get("pid") or 0)  # unknown rank: keep it apart, keyed by pid
        merged = trace.headers.setdefault(rank, dict(header))
        for ev in events:
            ev["rank"] = rank
            by_kind[ev["k"]].append(ev)
            if ev["k"] == schema.META and isinstance(ev.get("key"), str):
                merged[ev["key"]] = ev.get("value")
    if strict and trace.problems:
        raise DiagError(str(trace.problems[0]))
    if not trace.headers:
        msg = str(trace.problems[0]) if trace.problems else f"{path}: no readable trace"
        raise DiagError(msg)
    trace.frames = build_frames(by_kind, trace.problems, path)
    return trace


def _is_int(value: Any) -> bool:
    """None (absent) or a real integer: header fields a corrupt or hostile file may get wrong."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def build_frames(by_kind: dict[str, list[dict[str, Any]]], problems: list[LoadProblem] | None = None,
                 path: str = "") -> dict[str, pd.DataFrame]:
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
            problems.append(LoadProblem(path, f"{kind} records skipped: a field has the wrong type "
                                        f"({type(e).__name__})"))
    return out
