"""Skipped steps: the `Skipping step` lines checked against the frameworks' own counters.

DeepSpeed's `step=N, skipped=K` is cumulative; Megatron's `number of skipped iterations: n` counts the
iterations since its previous line. Both are exact where the per-overflow lines are not (DeepSpeed
prints them on rank 0 only, or not at all when the optimizer is not verbose; Megatron prints none), so
for each counted interval the count wins: lines beyond it are dropped, and missing skipped steps are
added (source `log_counter`) on the interval's first steps not already marked. A step number is then
exact when the interval is one iteration long or every iteration in it was skipped.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import islice

from diag.importers.logs.records import Overflow

MAX_ADDED = 10_000  # skipped steps added from counters, at most (a hostile counter must not blow up)


def reconcile(lines: list[Overflow], counts: list[tuple[int, int, int]]) -> list[Overflow]:
    out = sorted(lines, key=lambda o: o.step or 0)
    steps = [o.step or 0 for o in out]
    drop: set[int] = set()
    added: list[Overflow] = []
    end = 0  # counters of two families (Megatron-DeepSpeed prints both) cover the same iterations once
    for first, last, n in sorted(counts):
        if first <= end or last < first:
            continue
        end = last
        lo, hi = bisect_left(steps, first), bisect_right(steps, last)
        inside = out[lo:hi]
        n = min(n, last - first + 1)
        if len(inside) > n:
            drop.update(id(o) for o in inside[n:])
        elif len(inside) < n:
            taken = {o.step for o in inside}
            need = min(n - len(inside), MAX_ADDED - len(added))
            free = islice((s for s in range(first, last + 1) if s not in taken), max(need, 0))
            added.extend(Overflow(s, None, None, -1, None, "log_counter") for s in free)
    kept = [o for o in out if id(o) not in drop] + added
    return sorted(kept, key=lambda o: o.step or 0)
