"""`--json`: the report document as JSON (schema `diag.analyze`, `version` field; docs/analyze.md)."""

from __future__ import annotations

import json
from typing import IO, Any

from diag.report.records import Records, as_rows, lazy, materialize
from diag.report.row_text import rows_text

_OPTIONS: dict[str, Any] = {"indent": 2, "sort_keys": False, "default": str, "allow_nan": False}
_ENCODER = json.JSONEncoder(**_OPTIONS)
_INDENT = " " * _OPTIONS["indent"]


def render(doc: dict[str, Any]) -> str:
    return json.dumps(materialize(doc), **_OPTIONS)


def write(doc: dict[str, Any], out: IO[str]) -> None:
    """`render(doc)` and a newline written to `out` as it is encoded: the whole text and the encoder's
    list of its pieces are never held (+33 MiB at 16 ranks x 1,000 steps), nor a table's rows as
    dicts (`Records`: a chunk of rows at a time)."""
    _write(doc, out, 0)
    out.write("\n")


def _write(value: Any, out: IO[str], depth: int) -> None:
    """`value` as `json.dump` writes it `depth` levels deep: its lines indented by `depth` levels
    after the first (a JSON string holds no newline: a newline is the encoder's own)."""
    if isinstance(value, dict) and value and lazy(value):
        out.write("{")
        for i, (key, item) in enumerate(value.items()):
            out.write(("," if i else "") + "\n" + _INDENT * (depth + 1) + json.dumps(key) + ": ")
            _write(item, out, depth + 1)
        out.write("\n" + _INDENT * depth + "}")
    elif isinstance(value, Records):
        out.write("[")
        inner, n = "\n" + _INDENT * depth, 0
        for part in value.parts():  # a chunk's text as the encoder lays out a list, less its brackets
            text = rows_text(part)
            if text is None:
                text = _ENCODER.encode(as_rows(part))[2:-2]
            out.write(("," if n else "") + inner + text.replace("\n", inner))
            n += len(part)
        out.write((inner if n else "") + "]")
    else:
        inner = "\n" + _INDENT * depth
        for piece in _ENCODER.iterencode(value):
            out.write(piece.replace("\n", inner) if depth else piece)
