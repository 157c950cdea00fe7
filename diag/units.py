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


def flop_count(n: Any) -> str:
    """FLOPs in decimal units (GFLOP, TFLOP, ...), three significant digits."""
    return "-" if n is None else significant(n, ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"))


def flop_rate(tflops: Any) -> str:
    """A rate given in TFLOP/s, in the unit that reads best (12.3 TFLOP/s, 45.6 GFLOP/s)."""
    return (
        "-"
        if tflops is None
        else significant(tflops * 1e12, ("FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s"))
    )


def percent(frac: Any, digits: int = 1) -> str:
    """A fraction as a percentage (0.413 -> '41.3%')."""
    return "-" if frac is None else f"{frac * 100:.{digits}f}%"


def rate(n: Any, unit: str) -> str:
    """A per-second count, three significant digits, k/M/G on the number (12.3k tokens/s)."""
    if n is None:
        return "-"
    number = significant(n, ("", "k", "M", "G"))
    return f"{number.replace(' ', '')} {unit}/s"


def significant(n: float, units: tuple[str, ...]) -> str:
    """`n` scaled by 1000s through `units`, three significant digits ("26.1 KB/s")."""
    i = 0
    while abs(n) >= 1000 and i < len(units) - 1:
        n /= 1000
        i += 1
    text = f"{n:.3g}" if abs(n) >= 1 or n == 0 else f"{n:.3f}"
    return f"{text} {units[i]}"
