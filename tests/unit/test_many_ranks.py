"""The human renderers' per-rank tables at cluster scale (`report.many_ranks`): a table of more
than `RANKS_SHOWN` ranks keeps the first, the last and each column's extremes, compared in the
units the cells print; `--json` is not touched (the report tests' documents)."""

from diag.report.many_ranks import RANKS_SHOWN, condensed


def _table(n: int) -> tuple[str, list[str], list[list[str]]]:
    rows = []
    for r in range(n):
        busbw = "1.20 MB/s" if r == 7 else "900 KB/s"  # rank 7 the highest, though 1.20 < 900
        rows.append([str(r), "all_reduce", str(10 + (r == 30)), f"{5 + r % 3:.2f}", busbw, "12.3k samples/s"])
    if n > 20:
        rows[12][3] = "-"  # missing: never an extreme
        rows[20][3] = "0.50"  # the lowest time
    return "Collectives", ["rank", "op", "calls", "time ms", "busbw", "rate"], rows


def test_a_big_table_keeps_the_ranks_that_stand_out():
    title, header, rows = condensed(_table(40))
    ranks = [r[0] for r in rows]
    # first, last; calls: lowest rank 0 (ties: the first), highest 30; time: lowest 20, highest 2
    # (7.00, ties: the first); busbw: lowest 0, highest 7 (MB/s above KB/s); rate: all equal, 0
    assert ranks == ["0", "2", "7", "20", "30", "39"]
    assert "6 of 40 ranks" in title and header[0] == "rank"


def test_a_small_table_or_one_not_by_rank_is_as_it_was():
    small = _table(RANKS_SHOWN)
    assert condensed(small) is small
    layers = ("Top layers", ["layer", "ms"], [[f"l{i}", "1.00"] for i in range(50)])
    assert condensed(layers) is layers


def test_columns_of_units_that_do_not_compare_choose_nothing():
    title, header, rows = _table(40)
    for i, row in enumerate(rows):
        row[5] = "3 tokens/s" if i == 25 else "9 samples/s"  # two units of their own
        row[2] = "fast" if i == 33 else row[2]  # a word among numbers: neither numbers nor kinds
    _, _, kept = condensed((title, header, rows))
    assert [r[0] for r in kept] == ["0", "2", "7", "20", "39"]


def test_each_kind_of_row_gives_its_own_extremes():
    """The collectives' table holds a row a rank and op: all_gather's slowest rank is shown though
    every all_reduce is slower (a real 20-rank DDP job's all_gather fastest rank was hidden)."""
    title, header, rows = _table(40)
    gathers = [[r[0], "all_gather", "3", "1.00" if r[0] != "11" else "2.00", "9 KB/s", "-"] for r in rows]
    title, _, kept = condensed((title, header, [row for pair in zip(rows, gathers) for row in pair]))
    shown = {(r[0], r[1]) for r in kept}
    assert ("11", "all_gather") in shown and ("11", "all_reduce") not in shown
    assert ("0", "all_gather") in shown and ("39", "all_reduce") in shown  # the ends: every op
    assert "each op's lowest and highest" in title and "7 of 40 ranks" in title
