"""Number formatting shared by the panels (pure functions; "-" for unknown values)."""

from __future__ import annotations

from typing import Any

from diag import units


def ms(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def nbytes(x: float | None) -> str:
    """Sizes and memory in binary units, as the reports print them."""
    return units.binary_bytes(x)


def rate(x: float | None) -> str:
    """Link rates (PCIe, NVLink) in decimal GB/s, as NVML and the vendors quote them."""
    return units.decimal_rate(x)


def count(x: float) -> str:
    """A count that may be a mean: `61`, or `60.5` while one rank is a call behind."""
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def num(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def mem(peak: int | None, capacity: int | None) -> str:
    if peak is None:
        return "-"
    if not capacity:
        return nbytes(peak)
    return f"{nbytes(peak)} / {nbytes(capacity)} ({100 * peak / capacity:.0f}%)"
