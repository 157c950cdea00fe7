"""Skipped steps: the `Skipping step` lines checked against the frameworks' own counters.

DeepSpeed's `step=N, skipped=K` is cumulative; Megatron's `number of skipped iterations: n` counts the
iterations since its previous line. Both are exact where the per-overflow lines are not (DeepSpeed
prints them on rank 0 only, or not at all when the optimizer is not verbose; Megatron prints none), so
for each counted interval the count wins: lines beyond it are dropped, and missing skipped steps are
added (source `log_counter`) on the interval's first steps not already marked. A step number is then
exact when the interval is one iteration long or every iteration in it was skipped.
"""

from __future__ import annotations

from diag.importers.logs.records import Overflow


def reconcile(lines: list[Overflow], counts: list[tuple[int, int, int]]) -> list[Overflow]:
    out = sorted(lines, key=lambda o: o.step or 0)
    for first, last, n in counts:
        inside = [o for o in out if o.step is not None and first <= o.step <= last]
        if len(inside) > n:
            drop = {id(o) for o in inside[n:]}
            out = [o for o in out if id(o) not in drop]
        elif len(inside) < n:
            taken = {o.step for o in inside}
            free = [s for s in range(first, last + 1) if s not in taken][: n - len(inside)]
            out.extend(Overflow(s, None, None, -1, None, "log_counter") for s in free)
        out.sort(key=lambda o: o.step or 0)
    return out
