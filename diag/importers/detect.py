"""Tell what a path holds by its content: a diag trace, a Kineto trace, a training log, or a PyTorch
Flight Recorder dump."""

from __future__ import annotations

import glob
import gzip
import os
import zlib

from diag.importers import flight_recorder
from diag.importers.errors import ImportProblem
from diag.importers.jsonfile import GZIP_MAGIC
from diag.trace import safeio
from diag.trace.reader import TRACE_GLOB, capture_of, captures, trace_files

DIAG, KINETO, LOG, FR = "diag", "kineto", "log", "flight_recorder"
# files a directory contributes (a file named on the command line is always read)
DIR_SUFFIXES = (".json", ".json.gz", ".gz", ".log", ".txt", ".out", ".err")


def _head(path: str, n: int = 8192) -> bytes:
    try:
        with safeio.open_regular(path) as f:
            raw = f.read(n)
            if raw[:2] != GZIP_MAGIC:
                return raw
            f.seek(0)
            with gzip.open(f) as g:
                return g.read(n)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ImportProblem(f"truncated or corrupt gzip ({e})") from None
    except safeio.InputError as e:
        raise ImportProblem(str(e)) from None
    except OSError as e:
        raise ImportProblem(e.strerror or str(e)) from None


def kind_of_file(path: str) -> str:
    """DIAG, KINETO, LOG or FR; `ImportProblem` for an empty, binary or unknown file."""
    head = _head(path)
    text = head.lstrip()
    if not text:
        raise ImportProblem("empty file")
    if flight_recorder.is_dump(head):
        return FR
    if text.startswith(b"{") and b'"k"' in text.split(b"\n", 1)[0][:200]:
        return DIAG
    json_object = text.startswith(b"{") and not text.startswith(b"{'")  # HF Trainer's printed dicts: a log
    if (
        json_object
        or (text.startswith(b"[") and text[1:].lstrip()[:1] in (b"{", b"]"))
        or path.endswith((".json", ".json.gz"))
    ):  # a JSON name: let the parser say what is wrong
        return KINETO
    # control bytes mark a binary file; ESC (27) starts the ANSI colour codes of a coloured log (Ray's)
    if b"\x00" in head or sum(b < 9 or (13 < b < 32 and b != 27) for b in head[:512]) > 8:
        raise ImportProblem("binary file: not a diag trace, PyTorch profiler trace or training log")
    from diag.importers.logs import MARKERS  # here: the log importer needs pandas, JSON inputs do not

    if any(m in head for m in MARKERS) or safeio.file_size(path) > len(head):
        return LOG
    raise ImportProblem("not a diag trace, PyTorch profiler trace or DeepSpeed/Megatron log")


def expand(path: str, depth: int = 3) -> list[tuple[str, str | None]]:
    """(path, kind) pairs: a diag trace directory stays one entry; any other directory gives its
    files (sorted) and, `depth` levels down, its sub-folders' (a folder of runs, one per
    sub-folder, or torch's `plugins/profile/<date>/` tree). Kind None means undetectable:
    `kind_of_file` will say why."""
    if not os.path.exists(path):
        raise ImportProblem("no such file or directory")
    if not os.path.isdir(path):  # a FIFO or device too: kind_of_file refuses it with the reason
        return [(path, None)]
    if any(glob.glob(os.path.join(path, pat)) for pat in TRACE_GLOB):
        if captures(path) > 1:  # each file a source: `runs.group` tells the captures apart
            return [(f, DIAG) for f in sorted(trace_files(path), key=capture_of)]
        return [(path, DIAG)]
    entries = sorted(e for e in glob.glob(os.path.join(path, "*")) if not os.path.basename(e).startswith("."))
    out: list[tuple[str, str | None]] = [
        (f, None)
        for f in entries
        if os.path.isfile(f) and (f.endswith(DIR_SUFFIXES) or "." not in os.path.basename(f))
    ]
    for sub in (e for e in entries if depth > 0 and os.path.isdir(e) and not os.path.islink(e)):
        try:
            out.extend(expand(sub, depth - 1))
        except ImportProblem:
            pass  # an empty sub-folder is not an input
    if not out:
        raise ImportProblem("empty directory: no traces or logs in it")
    return out
