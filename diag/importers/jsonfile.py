"""Read a JSON document, plain or gzip-compressed, with one-line reasons for every failure.

orjson parses Kineto traces 2-3x faster than the stdlib; it is optional (the `analyze` extra).
"""

from __future__ import annotations

from typing import Any

from diag.importers.errors import ImportProblem
from diag.trace import safeio
from diag.trace.heap import release_memory  # noqa: F401 - moved to diag.trace; old imports keep working

try:
    import orjson

    loads: Any = orjson.loads
    JSONError: tuple[type[Exception], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - orjson is in the analyze extra
    import json

    loads = json.loads
    JSONError = (ValueError,)

GZIP_MAGIC = safeio.GZIP_MAGIC


def read_bytes(path: str) -> bytes:
    """The file's bytes, decompressed when it is gzip (by content, not by name). Only a regular
    file is read, and at most `safeio.max_input_bytes()` once decompressed (a gzip bomb stops there)."""
    try:
        return safeio.read_limited(path)
    except safeio.InputError as e:
        raise ImportProblem(str(e)) from None
    except OSError as e:
        raise ImportProblem(e.strerror or str(e)) from None


def load_json(path: str) -> Any:
    """Parse the whole document; a truncated or invalid file becomes an `ImportProblem`."""
    data = read_bytes(path)
    if not data.strip():
        raise ImportProblem("empty file")
    try:
        return loads(data)
    except JSONError as e:
        raise ImportProblem(f"invalid JSON ({str(e).splitlines()[0]})") from None
