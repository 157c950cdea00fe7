"""Coverage-guided fuzzing of diag's trace reader with atheris (libFuzzer): any bytes as a rank file
must load or fail with `DiagError`, never crash. `python -m tests.reliability.atheris_reader -runs=N`."""

from __future__ import annotations

import os
import sys
import tempfile

import atheris
import pandas  # noqa: F401 - loaded before instrumenting: only diag's own code gets coverage hooks

with atheris.instrument_imports():
    from diag.errors import DiagError
    from diag.trace.reader import load_trace

_DIR = tempfile.mkdtemp(prefix="diag-atheris-")
_PATH = os.path.join(_DIR, "rank-00000.jsonl")
_HEADER = b'{"k":"header","schema":1,"rank":0,"pid":1}\n'


def one_input(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(_HEADER + data if data[:1] != b"!" else data[1:])
    try:
        load_trace(_DIR)
    except DiagError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
