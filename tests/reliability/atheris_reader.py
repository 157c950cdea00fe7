"""Coverage-guided fuzzing of diag's readers with atheris (libFuzzer): any bytes as a rank file, a
Kineto trace, a training log or a file the TUI tails must load or fail with one line, never crash.
The first byte picks the reader. `python -m tests.reliability.atheris_reader -runs=N`."""

from __future__ import annotations

import os
import sys
import tempfile

import atheris
import pandas  # noqa: F401 - loaded before instrumenting: only diag's own code gets coverage hooks

with atheris.instrument_imports():
    from diag.errors import DiagError
    from diag.importers.errors import ImportProblem
    from diag.importers.kineto import import_file
    from diag.importers.logs import import_log
    from diag.trace.reader import load_trace
    from diag.tui.tail import DirTail

# the test gives its tmp_path: libFuzzer ends the process with exit(), so nothing here could remove
# a folder of its own
_DIR = os.environ.get("DIAG_FUZZ_DIR") or tempfile.mkdtemp(prefix="diag-atheris-")
_PATH = os.path.join(_DIR, "rank-00000.jsonl")
_HEADER = b'{"k":"header","schema":1,"rank":0,"pid":1}\n'


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def _one_line(err: Exception) -> None:
    if "\n" in str(err):
        raise AssertionError(f"a message of more than one line: {err!r}")


def one_input(data: bytes) -> None:
    pick, body = (data[0] % 4, data[1:]) if data else (0, b"")
    try:
        if pick == 0:
            _write(_PATH, _HEADER + body if body[:1] != b"!" else body[1:])
            for p in load_trace(_DIR).problems:
                _one_line(Exception(str(p)))
        elif pick == 1:
            import_file(_write(os.path.join(_DIR, "t.json"), body))
        elif pick == 2:
            import_log(_write(os.path.join(_DIR, "t.log"), body))
        else:
            _write(_PATH, body)
            DirTail(_DIR).poll()
    except (DiagError, ImportProblem) as e:
        _one_line(e)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
