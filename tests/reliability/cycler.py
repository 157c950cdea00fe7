"""`python -m tests.reliability.cycler LAUNCHER_PID TRACE_DIR CYCLES SEED`: attach to every rank under
the launcher and detach again, CYCLES times, at seeded random points; prints one JSON summary line.

A process of its own so that the test can time out any hang (each injection already runs in a child
process with its own timeout, but a rank that stops making progress would hang `detach` too).
"""

from __future__ import annotations

import json
import random
import sys
import time

from diag.control.client import request
from diag.inject.attach import attach_one
from diag.procs import ranks_under


def main(argv: list[str]) -> int:
    launcher, trace_dir, cycles, seed = int(argv[0]), argv[1], int(argv[2]), int(argv[3])
    rng = random.Random(seed)
    ranks = ranks_under(launcher)
    latencies, methods = [], set()
    for i in range(cycles):
        options = {"trace_dir": trace_dir, "layers_every": rng.choice([1, 2, 50])}
        t0 = time.perf_counter()
        for pid, rank in ranks:
            done = attach_one(pid, rank, dict(options), None, True)
            assert not done.reused, f"cycle {i}: pid {pid} still had an agent"
            methods.add(done.method)
        latencies.append(time.perf_counter() - t0)
        time.sleep(rng.uniform(0, 0.15))  # detach at a random point of a step
        for pid, _ in ranks:
            assert request(pid, "detach")["undo_failed"] == [], f"cycle {i}"
        time.sleep(rng.uniform(0, 0.15))
    print(json.dumps({"ranks": len(ranks), "latencies": latencies, "methods": sorted(methods)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
