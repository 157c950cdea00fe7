"""Number formatting shared by the reports and the demo (pure functions; "-" for unknown values)."""

from __future__ import annotations

from typing import Any


def ms(ns: Any) -> str:
    """Nanoseconds as milliseconds with two decimals."""
    return "-" if ns is None else f"{ns / 1e6:.2f}"


def binary_bytes(n: Any) -> str:
    """Bytes in binary units (KiB ... TiB), as message sizes and memory are usually read."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
