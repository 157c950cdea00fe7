"""Small self-made inline SVG charts for the HTML report (no plotting dependency, no scripts).

`lines` draws one polyline (or markers only, `dots=True`) per series; `stacked_bars` one bar per
category split into parts. Axes are linear, or log10 on x with `logx` (message sizes).
"""

from __future__ import annotations

import math
from html import escape

W, H, L, R, T, B = 640, 260, 64, 16, 28, 40
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")

Series = dict[str, list[tuple[float, float]]]


def _scale(lo: float, hi: float, a: float, b: float):  # type: ignore[no-untyped-def]
    span = (hi - lo) or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"


def _frame(title: str, xlabel: str, ylabel: str, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
            f'role="img" aria-label="{escape(title)}"><rect width="{W}" height="{H}" fill="white"/>'
            f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">{escape(title)}</text>'
            f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle" font-size="11">{escape(xlabel)}</text>'
            f'<text x="14" y="{H / 2}" font-size="11" transform="rotate(-90 14 {H / 2})" '
            f'text-anchor="middle">{escape(ylabel)}</text>{"".join(body)}</svg>')


def _axes(xlo: float, xhi: float, ylo: float, yhi: float, logx: bool) -> list[str]:
    out = [f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#333"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="#333"/>']
    for i in range(5):
        yv, xv = ylo + (yhi - ylo) * i / 4, xlo + (xhi - xlo) * i / 4
        y, x = H - B - (H - B - T) * i / 4, L + (W - L - R) * i / 4
        out.append(f'<text x="{L - 4}" y="{y + 4}" font-size="10" text-anchor="end">{_fmt(yv)}</text>')
        out.append(f'<text x="{x}" y="{H - B + 14}" font-size="10" text-anchor="middle">'
                   f'{_fmt(10 ** xv if logx else xv)}</text>')
    return out


def lines(series: Series, title: str, xlabel: str, ylabel: str, *, logx: bool = False,
          dots: bool = False) -> str:
    """A line (or dot) chart; an empty `series` gives a chart that says "no data"."""
    pts = {k: [(math.log10(x) if logx else x, y) for x, y in v if not logx or x > 0]
           for k, v in series.items()}
    allp = [p for v in pts.values() for p in v]
    if not allp:
        return _frame(title, xlabel, ylabel, [f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">'
                                              'no data</text>'])
    xlo, xhi = min(p[0] for p in allp), max(p[0] for p in allp)
    ylo, yhi = min(0.0, min(p[1] for p in allp)), max(p[1] for p in allp)
    sx, sy = _scale(xlo, xhi, L, W - R), _scale(ylo, yhi, H - B, T)
    body = _axes(xlo, xhi, ylo, yhi, logx)
    for i, (name, v) in enumerate(pts.items()):
        color = PALETTE[i % len(PALETTE)]
        xy = [(sx(x), sy(y)) for x, y in sorted(v)]
        if dots or len(xy) == 1:
            body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in xy]
        else:
            body.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="'
                        + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy) + '"/>')
        body.append(f'<text x="{W - R - 4}" y="{T + 12 * (i + 1)}" font-size="10" fill="{color}" '
                    f'text-anchor="end">{escape(name)}</text>')
    return _frame(title, xlabel, ylabel, body)


def stacked_bars(bars: dict[str, dict[str, float]], title: str, ylabel: str) -> str:
    """One bar per key of `bars`, stacked from its parts (e.g. rank -> {idle, compute, ...})."""
    if not bars:
        return lines({}, title, "", ylabel)
    parts = list(dict.fromkeys(p for v in bars.values() for p in v))
    top = max(sum(v.values()) for v in bars.values()) or 1.0
    sy = _scale(0, top, H - B, T)
    width = (W - L - R) / len(bars)
    body = _axes(0, 1, 0, top, False)[:2]
    body += [f'<text x="{L - 4}" y="{sy(top * i / 4) + 4}" font-size="10" text-anchor="end">'
             f'{_fmt(top * i / 4)}</text>' for i in range(5)]
    for i, (label, v) in enumerate(bars.items()):
        x, base = L + i * width + width * 0.15, 0.0
        for j, part in enumerate(parts):
            val = v.get(part, 0.0)
            body.append(f'<rect x="{x:.1f}" y="{sy(base + val):.1f}" width="{width * 0.7:.1f}" '
                        f'height="{sy(base) - sy(base + val):.1f}" fill="{PALETTE[j % len(PALETTE)]}">'
                        f'<title>{escape(label)} {escape(part)}: {_fmt(val)}</title></rect>')
            base += val
        body.append(f'<text x="{x + width * 0.35:.1f}" y="{H - B + 14}" font-size="10" '
                    f'text-anchor="middle">{escape(label)}</text>')
    body += [f'<text x="{W - R - 4}" y="{T + 12 * (j + 1)}" font-size="10" text-anchor="end" '
             f'fill="{PALETTE[j % len(PALETTE)]}">{escape(p)}</text>' for j, p in enumerate(parts)]
    return _frame(title, "", ylabel, body)
