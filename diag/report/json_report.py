"""`--json`: the report document as JSON (schema `diag.analyze`, `version` field; docs/analyze.md)."""

from __future__ import annotations

import json
from typing import Any


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, default=str, allow_nan=False)
