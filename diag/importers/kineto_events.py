"""Read a Kineto trace's events into column frames, a few MB of JSON at a time.

Parsing a whole trace into Python objects costs about 5x its size in memory. torch writes traces
pretty-printed, one event per indented block, and JSON strings cannot hold a raw newline, so the
boundary `\\n<indent>},\\n<indent>{` between two top-level events is unambiguous: the event array is
cut there into chunks that are parsed and reduced to columns one by one. A compact (one-line) file,
or one where any chunk does not parse, is parsed whole, the slow but always-right way.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from diag.importers.errors import ImportProblem
from diag.importers.jsonfile import JSONError, load_json, loads, read_bytes

CHUNK = 4 << 20
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
HOST_CATS = {"cpu_op", "user_annotation", "Operator", "python_function"}
KEEP_ARGS = ("record_param_comms", "gloo:", "nccl:")  # host ops whose args the comm import reads


def _split(data: bytes) -> tuple[bytes, Iterator[bytes]] | None:
    """(document without its events, event chunks as JSON arrays), or None if not pretty-printed."""
    key = data.find(b'"traceEvents"')
    start = data.find(b"[", key) + 1 if key >= 0 else 0
    first = data.find(b"{", start) if start else -1
    nl = data.rfind(b"\n", start, first) if first > 0 else -1
    if nl < 0 or data[nl + 1 : first].strip():
        return None
    indent = data[nl + 1 : first]
    close = data.rfind(b"\n" + indent + b"}")
    after = close + len(indent) + 2
    if close < first or data[after:].lstrip()[:1] != b"]":
        return None
    end = data.find(b"]", after)
    sep = b"\n" + indent + b"},\n" + indent + b"{"

    def chunks() -> Iterator[bytes]:
        pos = first
        while pos < after:
            cut = data.find(sep, min(pos + CHUNK, after), after)
            stop = after if cut < 0 else cut + len(indent) + 2
            yield b"[" + data[pos:stop] + b"]"
            pos = stop if cut < 0 else cut + len(sep) - 1

    return data[:start] + b"]" + data[end + 1 :], chunks()


def _frames(events: list[dict[str, Any]], names: dict[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """Complete (`X`) events by kind -> small frames; only the args the importer reads are kept.
    Events whose ts / dur is a number that is not a usable time (non-finite, beyond +-2**62 ns, a
    negative dur) are dropped and counted under `BAD` as (count, the first one described). Equal
    strings of the name, cat and tid columns become one object, shared through `names` by the
    chunks of a file (the parser makes one string per event: 20 bytes of column and 60-100 of
    string per event and column, until the frames turn them into categories)."""
    names = {} if names is None else names
    rows: dict[str, list[dict[str, Any]]] = {"gpu": [], "runtime": [], "host": []}
    for e in events:
        if type(e) is dict and e.get("ph") == "X":
            cat = e.get("cat")
            if not isinstance(cat, str):
                continue
            kind = (
                "gpu"
                if cat in GPU_CATS
                else "runtime"
                if cat in RUNTIME_CATS
                else ("host" if cat in HOST_CATS else None)
            )
            if kind is not None:
                rows[kind].append(e)
    out: dict[str, Any] = {}
    bad: list[Any] = [0, None]
    for kind, evs in rows.items():
        name, cat, ts, dur, tid = _fields(evs)
        name, cat, tid = (_shared(col, names) for col in (name, cat, tid))
        (ts_ns, ts_ok), (dur_ns, dur_ok) = _ns(ts), _ns(dur)
        keep = ts_ok & dur_ok & (dur_ns >= 0)
        # object columns even when empty: a trace with no host ops at all (older Kineto, an
        # inference capture) must not give float name columns the string matching fails on
        df = pd.DataFrame(
            {
                "name": pd.Series(name, dtype=object),
                "cat": pd.Series(cat, dtype=object),
                "ts": ts_ns,
                "dur": dur_ns,
                "tid": pd.Series(tid, dtype=object),
            }
        )
        args = [e.get("args") or {} for e in evs]
        if kind != "host":
            df["correlation"] = _ints([a.get("correlation", -1) for a in args])
            df["stream"] = _ints([a.get("stream", -1) for a in args])
        else:
            df["args"] = [a if str(n).startswith(KEEP_ARGS) else None for a, n in zip(args, name)]
        if not keep.all():
            i = int(np.flatnonzero(~keep)[0])
            bad[0] += int((~keep).sum())
            bad[1] = bad[1] or f"{str(name[i])[:60]!r} ts={str(ts[i])[:30]} dur={str(dur[i])[:30]}"
            df = df[keep].reset_index(drop=True)
        out[kind] = df
    out[BAD] = tuple(bad)
    return out


BAD = "bad"  # the key of (count, first described) of events dropped for unusable times
MAX_US = float(1 << 62) / 1000  # times beyond this many microseconds overflow int64 nanoseconds


_GET = operator.itemgetter("name", "cat", "ts", "dur", "tid")


def _fields(evs: list[dict[str, Any]]) -> tuple[Any, ...]:
    """name, cat, ts, dur, tid columns: one C-level pass when every event has them all."""
    try:
        cols = tuple(zip(*map(_GET, evs)))
    except KeyError:
        cols = tuple(
            zip(*((e.get("name", ""), e.get("cat"), e.get("ts"), e.get("dur", 0), e.get("tid")) for e in evs))
        )
    return cols if cols else ((), (), (), (), ())


def _shared(col: tuple[Any, ...], names: dict[str, str]) -> list[Any]:
    """`col` with each string replaced by the first equal one seen (only strings: 1, 1.0 and True
    are equal keys of a dict but not the same value)."""
    return [names.setdefault(v, v) if type(v) is str else v for v in col]


def _ns(us: Any) -> tuple[np.ndarray, np.ndarray]:
    """Microseconds -> (integer nanoseconds, which were usable times). Junk (absent, null, a
    string) counts 0 as it always did; a number that is not finite or beyond +-2**62 ns (NaN, 1e30,
    a 100-digit integer) is not a usable time."""
    try:
        vals = np.asarray(us, dtype=float)
    except (TypeError, ValueError, OverflowError):
        vals = pd.to_numeric(pd.Series(list(us), dtype=object), errors="coerce").to_numpy(float)
    ok = np.abs(vals) < MAX_US  # false for NaN and inf too
    if not ok.all():
        seq = us if isinstance(us, (list, tuple)) else list(us)
        for i in np.flatnonzero(~ok):
            v = seq[i]
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                ok[i] = True  # junk: 0, as before
    return np.rint(np.where(np.abs(vals) < MAX_US, vals, 0.0) * 1000).astype(np.int64), ok


def _ints(vals: list[Any]) -> np.ndarray:
    """Correlation ids / stream numbers as int64; a value that is not one becomes -1."""
    try:
        return np.array(vals, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array(
            [v if type(v) is int and -(1 << 63) <= v < 1 << 63 else -1 for v in vals], dtype=np.int64
        )


def _parse_chunks(data: bytes) -> tuple[dict[str, Any], list[dict[str, pd.DataFrame]]] | None:
    split = _split(data)
    if split is None:
        return None
    head, chunks = split
    try:
        doc = loads(head)
        names: dict[str, str] = {}
        parts = [_frames(loads(c), names) for c in chunks]
    except JSONError:
        return None
    return (doc, parts) if isinstance(doc, dict) else None


def read_events(path: str) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """(the document without `traceEvents`, frames `gpu`, `runtime`, `host`): streamed where the
    file allows it (kineto_stream), else read whole and cut, else parsed whole."""
    from diag.importers.kineto_stream import parse_streamed

    parsed = parse_streamed(path) or _parse_chunks(read_bytes(path))
    if parsed is None:
        doc = load_json(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise ImportProblem("not a PyTorch profiler trace (no traceEvents list)")
        parsed = doc, [_frames(doc.pop("traceEvents"))]
    doc, parts = parsed
    frames = {
        k: pd.concat([p[k] for p in parts], ignore_index=True) if len(parts) > 1 else parts[0][k]
        for k in ("gpu", "runtime", "host")
    }
    n_bad = sum(p[BAD][0] for p in parts)
    if n_bad:
        first = next(p[BAD][1] for p in parts if p[BAD][0])
        doc[BAD] = (
            f"skipped {n_bad} events whose ts or dur is not a time (negative, non-finite, "
            f"out of range; first: {first})"
        )
    return doc, frames
