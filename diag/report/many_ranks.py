"""A per-rank table of a big job, as people read it: the ranks that stand out, not all of them.

At 256 ranks the terminal report ran to 3,148 lines (a row a rank in five tables, a row a rank and
op in the collectives'); at 1,024 it would be ~12,000, which nobody reads. The terminal, Markdown
and HTML renderers show a table of more than `RANKS_SHOWN` ranks by the ranks worth a look: the
first and the last, and in each column of numbers the rank of its lowest and of its highest row
(in the units the cell prints: 900 KB/s below 1.2 MB/s), and the title says so. A table of several
kinds of row a rank (the collectives' ops) gives each kind's extremes: all_gather's slowest rank is
not hidden by all_reduce's, which are slower still. `--json` keeps
every rank's row of these tables; its per-(rank, step) tables keep some ranks' above 65,536
rank-steps (`kept_ranks`).
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
    numbers = {col: _column(rows, col) for col in range(1, len(header))}
    words = [col for col in numbers if _kind_column(rows, col)]  # op, straggler yes/no: a row's kind

    def kind(row: list[str]) -> tuple[str, ...]:
        return tuple(row[col] for col in words)

    kinds: dict[tuple[str, ...], list[int]] = {}
    for i, row in enumerate(rows):
        kinds.setdefault(kind(row), []).append(i)
    ends = {ranks[0], ranks[-1]}
    keep: set[tuple[str, tuple[str, ...]]] = set()  # (rank, kind): the ends' rows are all kept
    for of in kinds.values():  # each kind's extremes (the collectives': each op's)
        for values in numbers.values():
            shown = [(values[i], i) for i in of if values is not None and values[i] is not None]
            if shown:
                for i in (min(shown)[1], max(shown, key=lambda x: (x[0], -x[1]))[1]):
                    keep.add((rows[i][0], kind(rows[i])))
    kept = [row for row in rows if (row[0], kind(row)) in keep or row[0] in ends]
    each = (
        f"each {header[words[0]]}'s lowest and highest in each column"
        if words
        else "each column's lowest and highest"
    )
    count = len({row[0] for row in kept})
    note = f" [{count} of {len(ranks):,} ranks: the first, the last, and {each}; every rank in --json]"
    return title + note, header, kept


def _kind_column(rows: list[list[str]], col: int) -> bool:
    """A column of words, two or more (an op's name, yes / no): no cell a number diag prints."""
    cells = {row[col].strip() for row in rows if col < len(row)} - {"-"}
    return len(cells) > 1 and not any(_CELL.match(cell) for cell in cells)


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
