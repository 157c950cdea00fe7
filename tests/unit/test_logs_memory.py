"""A log's memory lines are kept as bounded reductions (`records.MemoryRows`): each rank's highest
allocated / reserved / peak and its last row exactly, and the lowest ranks' timelines thinned evenly,
so a long many-rank log holds the same few rows whatever its length."""

from __future__ import annotations

import random

from diag.importers.logs import import_log
from diag.importers.logs.records import MEMORY_RANKS, MEMORY_ROWS

GB = 1 << 30


def _write(path, ranks: int, steps: int) -> dict[int, list[tuple[int, float, float, float]]]:
    """DeepSpeed timer lines (allocated, max allocated) and `see_memory_usage` lines (MA, Max_MA, CA)
    from every rank, the ranks interleaved as in a merged log; returns each rank's printed figures."""
    rnd = random.Random(7)
    printed: dict[int, list[tuple[int, float, float, float]]] = {r: [] for r in range(ranks)}
    with open(path, "w", encoding="utf-8") as f:
        for step in range(1, steps + 1):
            for r in reversed(range(ranks)):  # the highest ranks print first
                ma, mx, ca = (round(rnd.uniform(1, 40), 2) for _ in range(3))
                f.write(
                    f"[rank{r}]: [2024-03-08 16:30:43,781] [INFO] [timer.py:260:stop] "
                    f"epoch=0/micro_step={4 * step}/global_step={step}, "
                    "RunningAvgSamplesPerSec=41.25, CurrSamplesPerSec=42.67, "
                    f"MemAllocated={ma}GB, MaxMemAllocated={mx}GB\n"
                )
                f.write(
                    f"[rank{r}]: MA {ma} GB         Max_MA {mx} GB         CA {ca} GB"
                    f"         Max_CA {ca} GB\n"
                )
                printed[r].append((step, ma * GB, mx * GB, ca * GB))
    return printed


def test_memory_rows_stay_bounded_with_exact_peaks(tmp_path):
    ranks, steps = MEMORY_RANKS + 4, 3 * MEMORY_ROWS
    printed = _write(tmp_path / "mem.log", ranks, steps)
    mem = import_log(str(tmp_path / "mem.log")).frames["memory"]
    rows_per_rank = 2 * steps
    assert len(mem) < MEMORY_RANKS * 2 * MEMORY_ROWS + 4 * ranks < ranks * rows_per_rank / 2
    for r, figs in printed.items():
        mine = mem[mem["rank"] == r]
        assert mine["allocated"].max() == max(a for _, a, _, _ in figs)
        assert mine["peak"].max() == max(p for _, _, p, _ in figs)
        assert mine["reserved"].max() == max(c for _, _, _, c in figs)
        assert mine["step"].iloc[-1] == steps  # the last row is kept
        if r < MEMORY_RANKS:  # a timeline: rows spread evenly over the run
            assert MEMORY_ROWS <= len(mine) <= 2 * MEMORY_ROWS + 3
            gaps = mine["step"].diff().dropna()
            assert gaps.max() <= 2 * (rows_per_rank // len(mine)) + 1
        else:  # only the rows holding the peaks and the last
            assert len(mine) <= 4
    assert list(mem.index) == sorted(mem.index)


def test_a_short_log_keeps_every_memory_row(tmp_path):
    printed = _write(tmp_path / "short.log", 3, 50)
    mem = import_log(str(tmp_path / "short.log")).frames["memory"]
    assert len(mem) == 3 * 50 * 2
    assert list(mem["rank"][:4]) == [2, 2, 1, 1]  # in the log's order
    got = mem[mem["rank"] == 0][["allocated", "peak"]].to_numpy().tolist()[::2]
    assert got == [[a, p] for _, a, p, _ in printed[0]]
