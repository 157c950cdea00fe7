"""A per-rank table of a big job, as people read it: the ranks that stand out, not all of them.

At 256 ranks the terminal report ran to 3,148 lines (a row a rank in five tables, a row a rank and
op in the collectives'); at 1,024 it would be ~12,000, which nobody reads. The terminal, Markdown
and HTML renderers show a table of more than `RANKS_SHOWN` ranks by the ranks worth a look: the
first and the last, and in each column of numbers the rank of its lowest and of its highest row
(in the units the cell prints: 900 KB/s below 1.2 MB/s), and the title says so. `--json` keeps
every row: the decision on the report's per-(rank, step) rows at cluster scale (docs/scale.md).
"""

from __future__ import annotations

import re

RANKS_SHOWN = 16  # a table of more ranks than this is condensed (2 + 2 a column stay under it)

Table = tuple[str, list[str], list[list[str]]]

_CELL = re.compile(r"^(-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)([kMG]?)(%|\s+\S+)?$")
_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}
_UNITS = {  # the units diag.units prints, in each one's base
    **{u: 1024.0**i for i, u in enumerate(("B", "KiB", "MiB", "GiB", "TiB"))},
    **{u + "/s": 1000.0**i for i, u in enumerate(("B", "KB", "MB", "GB", "TB"))},
    **{p + "FLOP": 1000.0**i for i, p in enumerate(("", "k", "M", "G", "T", "P"))},
    **{p + "FLOP/s": 1000.0**i for i, p in enumerate(("", "k", "M", "G", "T", "P"))},
}


def condensed(table: Table, limit: int = RANKS_SHOWN) -> Table:
    """`table` (first column the rank) with only the notable ranks' rows when it has more than
    `limit` ranks; any other table as it is."""
    title, header, rows = table
    ranks = list(dict.fromkeys(row[0] for row in rows))
    if not header or header[0] != "rank" or len(ranks) <= limit:
        return table
    keep = {ranks[0], ranks[-1]}
    for col in range(1, len(header)):
        values = _column(rows, col)
        if values is not None:
            shown = [(v, i) for i, v in enumerate(values) if v is not None]
            if shown:
                keep |= {rows[min(shown)[1]][0], rows[max(shown, key=lambda x: (x[0], -x[1]))[1]][0]}
    kept = [row for row in rows if row[0] in keep]
    note = (
        f" [{len(keep)} of {len(ranks):,} ranks: the first, the last, and each column's lowest and "
        "highest; every rank in --json]"
    )
    return title + note, header, kept


def _column(rows: list[list[str]], col: int) -> list[float | None] | None:
    """The column's cells as numbers in one unit ("-": None), or None when a cell is not a number
    diag prints (text, a label) or its units cannot be compared (a unit diag.units does not print,
    such as samples/s, compares only with itself)."""
    out: list[float | None] = []
    own: set[str] = set()  # units not in _UNITS
    known = False
    for row in rows:
        cell = row[col].strip() if col < len(row) else "-"
        if cell == "-":
            out.append(None)
            continue
        m = _CELL.match(cell)
        if m is None:
            return None
        unit = (m.group(3) or "").strip()
        if unit in _UNITS:
            known = True
        else:
            own.add(unit)
        out.append(float(m.group(1)) * _PREFIX[m.group(2)] * _UNITS.get(unit, 1.0))
    return None if len(own) > 1 or (own and known) else out
