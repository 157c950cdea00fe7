"""Helpers that turn figures into a finding's evidence and scope (plain, JSON-ready values)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def by_rank(values: pd.Series, cast: type = float) -> dict[int, Any]:
    """A per-rank series as evidence: {rank: value} with plain Python numbers (JSON-ready)."""
    return {int(r): cast(v) for r, v in values.items()}


def spans_hosts(ranks: Any, host_of: dict[int, str]) -> bool:
    """Does a group (list of global ranks; missing: the whole job) include ranks on more than one host?"""
    if ranks is None or isinstance(ranks, float):
        return len(set(host_of.values())) > 1
    return len({host_of.get(int(r), "?") for r in ranks} - {"?"}) > 1
