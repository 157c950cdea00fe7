"""The waterfall: the change in mean time per unit (step, sample or token), split by label.

Means, not medians: a mean of sums is the sum of means, so the parts add up exactly to the total
(kept as `Fraction`s of nanoseconds; floats only when rendered). Medians and p90 are in the headline.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import pandas as pd

from diag.diff.split import COMPUTE, IDLE, OPTIMIZER, OTHER, SKIPPED

UNITS = ("step", "sample", "token")
ORDER = (COMPUTE, "comm:", IDLE, OPTIMIZER, SKIPPED, OTHER)  # display order of label families


@dataclass
class Side:
    """One side's mean time per unit, total and by label (ns, exact)."""

    total: Fraction
    parts: dict[str, Fraction]
    rows: int


@dataclass
class Waterfall:
    unit: str
    baseline: Side
    candidate: Side
    delta: dict[str, Fraction]  # candidate - baseline per label; sums exactly to `total`
    total: Fraction


def labels_of(split: pd.DataFrame) -> list[str]:
    return [c for c in split.columns if c not in ("rank", "step", "dur_ns", "sampled")]


def side(split: pd.DataFrame, per_unit: float | None) -> Side:
    """Mean per (rank, step) row, divided by the unit count per step (samples or tokens)."""
    n = len(split)
    div = Fraction(per_unit).limit_denominator(10**6) if per_unit else Fraction(1)
    parts = {lab: Fraction(int(split[lab].sum()), n) / div for lab in labels_of(split)}
    return Side(total=Fraction(int(split["dur_ns"].sum()), n) / div, parts=parts, rows=n)


def _rank(label: str) -> tuple[int, str]:
    for i, prefix in enumerate(ORDER):
        if label == prefix or (prefix.endswith(":") and label.startswith(prefix)):
            return i, label
    return len(ORDER), label


def build(a: pd.DataFrame, b: pd.DataFrame, unit: str, per_a: float | None, per_b: float | None) -> Waterfall:
    sa, sb = side(a, per_a), side(b, per_b)
    labels = sorted(set(sa.parts) | set(sb.parts), key=_rank)
    delta = {lab: sb.parts.get(lab, Fraction(0)) - sa.parts.get(lab, Fraction(0)) for lab in labels}
    return Waterfall(unit=unit, baseline=sa, candidate=sb, delta=delta, total=sb.total - sa.total)


def by_rank(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per rank (matched by index) and label: mean ns per step, candidate - baseline."""
    labs = sorted(set(labels_of(a)) | set(labels_of(b)), key=_rank)
    ma = a.groupby("rank")[[*labels_of(a), "dur_ns"]].mean().reindex(columns=[*labs, "dur_ns"]).fillna(0)
    mb = b.groupby("rank")[[*labels_of(b), "dur_ns"]].mean().reindex(columns=[*labs, "dur_ns"]).fillna(0)
    return mb.sub(ma, fill_value=0)
