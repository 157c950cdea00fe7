"""How a rank reads, in every report table, plot, `--json`'s `rank_labels` and `diag top`.

The trace reader keys a process that ran without a rank (`diag run -- python train.py`, no launcher)
by minus its pid, to keep it apart from the real ranks; a log line that names no rank is -1. Printed
as numbers those keys read "-20267" in a rank column: here they read `pid 20267`.
"""

from __future__ import annotations

from typing import Any

NO_RANK = -1  # a log line that names no rank (diag.importers.logs); pid 1 reads the same


def rank_label(rank: Any) -> str:
    """A rank column's cell: `3`, `pid 20267` for a process without a rank, `-` for none."""
    if rank is None or rank != rank:  # None or NaN
        return "-"
    r = int(rank)
    if r >= 0:
        return str(r)
    return "-" if r == NO_RANK else f"pid {-r}"


def rank_name(rank: Any) -> str:
    """The rank in a sentence or a plot's legend: `rank 3`, `pid 20267`, `no rank`."""
    label = rank_label(rank)
    if label == "-":
        return "no rank"
    return label if label.startswith("pid ") else f"rank {label}"


def rank_list(ranks: Any, limit: int | None = 8, sep: str = ",") -> str:
    """Several ranks in one cell, the first `limit` of them (None: all); `-` for none."""
    return sep.join(rank_label(r) for r in list(ranks or [])[:limit]) or "-"


def rank_labels(ranks: Any) -> dict[str, str]:
    """`--json`'s `rank_labels`: each rank key of the document -> how the reports print it."""
    return {str(r): rank_label(r) for r in ranks}


def rank_names(ranks: Any) -> str:
    """Several ranks in a sentence: `rank 3`, `ranks 0, 2`, `pid 20267`, `rank 0, pid 20267`."""
    labels = [rank_label(r) for r in list(ranks or [])]
    if not labels:
        return "no rank"
    if any(lb.startswith("pid ") or lb == "-" for lb in labels):
        return ", ".join(rank_name(r) for r in ranks)
    return f"rank{'s' if len(labels) > 1 else ''} {', '.join(labels)}"


def rank_count(ranks: Any) -> str:
    """How many processes a document holds: `2 ranks`, `1 process without a rank`, `1 rank`; a log
    that names no rank (torchrun's children printing without a prefix) `ranks not named`, not `0 ranks`."""
    keys = [int(r) for r in list(ranks or []) if r == r and r is not None]
    if not keys:
        return "ranks not named"
    real = sum(1 for r in keys if r >= 0)
    other = len(keys) - real
    bits = [f"{real} rank{'s' if real != 1 else ''}"] if real or not other else []
    if other:
        bits.append(f"{other} process{'es' if other != 1 else ''} without a rank")
    return ", ".join(bits)
