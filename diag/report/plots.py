"""Small self-made inline SVG charts for the HTML report (no plotting dependency, no scripts).

`lines` draws one polyline (or markers only, `dots=True`) per series; `stacked_bars` one bar per
category split into parts; `lanes` one row of spans per lane (each rank's steps in time). Axes are
linear, or log10 on x with `logx` (message sizes, labelled in bytes). Legends sit above the plotting
area, wrapped onto as many rows as they need (the area shrinks), never over the data.
"""

from __future__ import annotations

import math
from html import escape

from diag.units import binary_bytes

W, H, L, R, T, B = 640, 270, 64, 16, 44, 40
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")

Series = dict[str, list[tuple[float, float]]]


def _scale(lo: float, hi: float, a: float, b: float):  # type: ignore[no-untyped-def]
    span = (hi - lo) or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def _fmt(v: float) -> str:
    """A tick value without exponents: 0.0525, 36.1, 3730, 1.2M."""
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g}G"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    return f"{v:.0f}" if a >= 100 else f"{v:.3g}"


def _frame(title: str, xlabel: str, ylabel: str, body: list[str], top: float = T) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{escape(title)}"><rect width="{W}" height="{H}" fill="white"/>'
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">{escape(title)}</text>'
        f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle" font-size="11">{escape(xlabel)}</text>'
        f'<text x="14" y="{(H - B + top) / 2}" font-size="11" transform="rotate(-90 14 {(H - B + top) / 2})" '
        f'text-anchor="middle">{escape(ylabel)}</text>{"".join(body)}</svg>'
    )


def _xticks(xlo: float, xhi: float, integer: bool) -> list[float]:
    """Five ticks over [xlo, xhi], or whole numbers only (steps) when `integer`."""
    if not integer:
        return [xlo + (xhi - xlo) * i / 4 for i in range(5)]
    step = max(1, math.ceil((xhi - xlo) / 8))
    return [float(v) for v in range(math.ceil(xlo), math.floor(xhi) + 1, step)] or [xlo]


def _nice_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Round ticks (1, 2 or 5 times a power of ten apart) over [lo, hi]: 0, 20, 40 s, not 0.0971."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / most
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _axes(
    xlo: float, xhi: float, ylo: float, yhi: float, logx: bool, integer_x: bool = False, top: float = T
) -> list[str]:
    out = [
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#333"/>',
        f'<line x1="{L}" y1="{top}" x2="{L}" y2="{H - B}" stroke="#333"/>',
    ]
    sx = _scale(xlo, xhi, L, W - R)
    for i in range(5):
        yv, y = ylo + (yhi - ylo) * i / 4, H - B - (H - B - top) * i / 4
        out.append(f'<text x="{L - 4}" y="{y + 4}" font-size="10" text-anchor="end">{_fmt(yv)}</text>')
    ticks = _xticks(xlo, xhi, integer_x)
    for i, xv in enumerate(ticks):
        label = f"{xv:.0f}" if integer_x else binary_bytes(10**xv) if logx else _fmt(xv)
        anchor = "start" if i == 0 and len(ticks) > 1 else "end" if i == len(ticks) - 1 and i else "middle"
        out.append(
            f'<text x="{sx(xv):.1f}" y="{H - B + 14}" font-size="10" '
            f'text-anchor="{anchor}">{escape(label)}</text>'
        )
    return out


LEGEND_ROW = 13  # px per legend row


def _legend(names: list[str], colors: list[str] | None = None, reserve: float = 0) -> tuple[list[str], float]:
    """Legend entries under the title, wrapped onto rows that fit the width (`reserve` px kept free
    at the right of the first row); returns them and the top of the plotting area below them."""
    placed, x, row = [], float(L), 0
    for i, name in enumerate(names):
        width = 24 + 6.2 * len(name)
        limit = W - R - (reserve if row == 0 else 0)
        if x > L and x + width - 10 > limit:
            x, row = float(L), row + 1
        placed.append((x, row, name, (colors or [])[i] if colors else PALETTE[i % len(PALETTE)]))
        x += width
    out = [
        f'<rect x="{x:.0f}" y="{T - 16 + r * LEGEND_ROW}" width="10" height="10" fill="{color}"/>'
        f'<text x="{x + 14:.0f}" y="{T - 7 + r * LEGEND_ROW}" font-size="10">{escape(name)}</text>'
        for x, r, name, color in placed
    ]
    return out, T + LEGEND_ROW * (row if placed else 0)


def lines(
    series: Series,
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    logx: bool = False,
    dots: bool = False,
    integer_x: bool = False,
    marks: list[float] | None = None,
    mark_label: str = "",
) -> str:
    """A line (or dot) chart; an empty `series` gives a chart that says "no data". `marks`: x values
    drawn as dashed vertical lines (overflow steps), named `mark_label` in the legend."""
    pts = {
        k: [(math.log10(x) if logx else x, y) for x, y in v if not logx or x > 0] for k, v in series.items()
    }
    allp = [p for v in pts.values() for p in v]
    if not allp:
        return _frame(
            title, xlabel, ylabel, [f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text>']
        )
    xlo, xhi = min(p[0] for p in allp), max(p[0] for p in allp)
    ylo, yhi = min(0.0, min(p[1] for p in allp)), max(p[1] for p in allp)
    shown = [m for m in marks or [] if xlo <= m <= xhi]
    mark_w = 14 + 6.2 * len(mark_label) if shown and mark_label else 0
    legend, top = _legend(list(pts), reserve=mark_w)
    sx, sy = _scale(xlo, xhi, L, W - R), _scale(ylo, yhi, H - B, top)
    body = _axes(xlo, xhi, ylo, yhi, logx, integer_x, top)
    body += [
        f'<line x1="{sx(m):.1f}" y1="{top}" x2="{sx(m):.1f}" y2="{H - B}" stroke="#c00" '
        f'stroke-dasharray="3,3"><title>{escape(mark_label)} {m:g}</title></line>'
        for m in shown
    ]
    for i, v in enumerate(pts.values()):
        color = PALETTE[i % len(PALETTE)]
        xy = [(sx(x), sy(y)) for x, y in sorted(v)]
        if dots or len(xy) == 1:
            body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in xy]
        else:
            body.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="'
                + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
                + '"/>'
            )
    body += legend
    if shown and mark_label:
        body.append(
            f'<text x="{W - R}" y="{T - 7}" font-size="10" fill="#c00" text-anchor="end">'
            f"- - {escape(mark_label)}</text>"
        )
    return _frame(title, xlabel, ylabel, body, top)


def stacked_bars(bars: dict[str, dict[str, float]], title: str, ylabel: str) -> str:
    """One bar per key of `bars`, stacked from its parts (e.g. rank -> {idle, compute, ...})."""
    if not bars:
        return lines({}, title, "", ylabel)
    parts = list(dict.fromkeys(p for v in bars.values() for p in v))
    legend, area_top = _legend(parts)
    top = max(sum(v.values()) for v in bars.values()) or 1.0
    sy = _scale(0, top, H - B, area_top)
    width = (W - L - R) / len(bars)
    body = _axes(0, 1, 0, top, False, top=area_top)[:2]
    body += [
        f'<text x="{L - 4}" y="{sy(top * i / 4) + 4}" font-size="10" text-anchor="end">'
        f"{_fmt(top * i / 4)}</text>"
        for i in range(5)
    ]
    for i, (label, v) in enumerate(bars.items()):
        x, base = L + i * width + width * 0.15, 0.0
        for j, part in enumerate(parts):
            val = v.get(part, 0.0)
            body.append(
                f'<rect x="{x:.1f}" y="{sy(base + val):.1f}" width="{width * 0.7:.1f}" '
                f'height="{sy(base) - sy(base + val):.1f}" fill="{PALETTE[j % len(PALETTE)]}">'
                f"<title>{escape(label)} {escape(part)}: {_fmt(val)}</title></rect>"
            )
            base += val
        body.append(
            f'<text x="{x + width * 0.35:.1f}" y="{H - B + 14}" font-size="10" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    body += legend
    return _frame(title, "", ylabel, body, area_top)


Span = tuple[float, float, str, str]  # start, duration, tooltip, color


def lanes(rows: dict[str, list[Span]], title: str, xlabel: str, legend: dict[str, str]) -> str:
    """One horizontal lane per key of `rows` (top to bottom), each span a rectangle from its start
    for its duration, colored as given and named in its tooltip; `legend`: name -> color."""
    spans = [s for v in rows.values() for s in v]
    if not spans:
        return lines({}, title, xlabel, "")
    entries, top = _legend(list(legend), list(legend.values()))
    xlo, xhi = min(s[0] for s in spans), max(s[0] + s[1] for s in spans)
    sx = _scale(xlo, xhi, L, W - R)
    body = _axes(xlo, xhi, 0, 1, False, top=top)[:2]
    body += [
        f'<text x="{sx(xv):.1f}" y="{H - B + 14}" font-size="10" text-anchor="middle">{_fmt(xv)}</text>'
        for xv in _nice_ticks(xlo, xhi)
    ]
    lane_h = (H - B - top) / len(rows)
    for i, (name, v) in enumerate(rows.items()):
        y = top + i * lane_h
        if lane_h >= 8:
            body.append(
                f'<text x="{L - 4}" y="{y + lane_h / 2 + 4:.1f}" font-size="10" '
                f'text-anchor="end">{escape(name)}</text>'
            )
        for start, dur, tip, color in v:
            body.append(
                f'<rect x="{sx(start):.2f}" y="{y + lane_h * 0.15:.1f}" '
                f'width="{max(sx(start + dur) - sx(start), 0.5):.2f}" height="{lane_h * 0.7:.1f}" '
                f'fill="{color}"><title>{escape(tip)}</title></rect>'
            )
    body += entries
    return _frame(title, xlabel, "", body, top)
