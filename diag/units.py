"""Number formatting shared by the reports and the demo (pure functions; "-" for unknown values)."""

from __future__ import annotations

from typing import Any


def ms(ns: Any) -> str:
    """Nanoseconds as milliseconds with two decimals."""
    return "-" if ns is None else f"{ns / 1e6:.2f}"


def binary_bytes(n: Any) -> str:
    """Bytes in binary units (KiB ... TiB), as message sizes and memory are usually read."""
    return "-" if n is None else _scaled(n, 1024, ("B", "KiB", "MiB", "GiB", "TiB"))


def decimal_rate(n: Any) -> str:
    """Bytes per second in decimal units (GB/s), as NVML and the vendors quote link rates."""
    return "-" if n is None else _scaled(n, 1000, ("B", "KB", "MB", "GB", "TB"), "/s")


def _scaled(n: float, base: int, units: tuple[str, ...], suffix: str = "") -> str:
    for unit in units:
        if abs(n) < base or unit == units[-1]:
            return f"{n:.0f} {unit}{suffix}" if unit == units[0] else f"{n:.1f} {unit}{suffix}"
        n /= base
    return "-"
