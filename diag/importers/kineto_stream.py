"""Read an uncompressed, pretty-printed Kineto trace a few MB at a time, never holding it whole.

The cut between events is kineto_events' (`\\n<indent>},\\n<indent>{`, unambiguous since JSON
strings hold no raw newline); the events array's end and the document's keys after it are found
in the last piece. Anything else (gzip, a compact file, a cut that does not parse, a file over the
input limit or growing past it) returns None: the caller reads the file whole, the slow but
always-right way. The frames are the same either way; only the peak memory differs (a 150 MiB
rank file held whole is 150 MiB of the peak).
"""

from __future__ import annotations

from typing import Any, BinaryIO

import pandas as pd

from diag.importers import kineto_events as ke
from diag.importers.jsonfile import JSONError, loads
from diag.trace import safeio

Parts = tuple[dict[str, Any], list[dict[str, pd.DataFrame]]]


def parse_streamed(path: str) -> Parts | None:
    """(the document without its events, each piece's frames) of a pretty-printed trace; None
    where the file must be read whole."""
    try:
        with safeio.open_regular(path) as f:
            return _parse(f, safeio.max_input_bytes())
    except (OSError, safeio.InputError, *JSONError):
        return None


def _parse(f: BinaryIO, limit: int) -> Parts | None:
    buf, eof = f.read(ke.CHUNK), False
    if buf[:2] == safeio.GZIP_MAGIC:
        return None
    key = buf.find(b'"traceEvents"')
    start = buf.find(b"[", key) + 1 if key >= 0 else 0
    first = buf.find(b"{", start) if start else -1
    nl = buf.rfind(b"\n", start, first) if first > 0 else -1
    if nl < 0 or buf[nl + 1 : first].strip():
        return None  # compact, or the events do not start in the first piece
    indent = buf[nl + 1 : first]
    sep = b"\n" + indent + b"},\n" + indent + b"{"
    head, buf, total = buf[:start], buf[first:], len(buf)
    names: dict[str, str] = {}
    parts = []
    while True:
        cut = buf.find(sep, ke.CHUNK)
        while cut < 0 and not eof:  # read on until a cut past CHUNK bytes, or the end
            more = f.read(ke.CHUNK)
            total += len(more)
            if total > limit:
                return None
            eof = not more
            buf += more
            cut = buf.find(sep, ke.CHUNK)
        if cut < 0:
            break
        stop = cut + len(indent) + 2
        parts.append(ke._frames(loads(b"[" + buf[:stop] + b"]"), names))
        buf = buf[cut + len(sep) - 1 :]  # from the next event's {
    close = buf.rfind(b"\n" + indent + b"}")
    after = close + len(indent) + 2
    if close < 0 or buf[after:].lstrip()[:1] != b"]":
        return None
    end = buf.find(b"]", after)
    parts.append(ke._frames(loads(b"[" + buf[:after] + b"]"), names))
    doc = loads(head + b"]" + buf[end + 1 :])
    return (doc, parts) if isinstance(doc, dict) else None
