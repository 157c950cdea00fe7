"""A large group's ranks written once a step (`trace.comm_line`) against on every call, side by side:
bytes of trace a call, the writer's CPU a call (`comm_text`) and the reader's (`reader.read_file`:
parse and fill), for calls of one data-parallel group of N ranks, `--calls` a step (a ZeRO-3 step
makes hundreds):

    python -m bench.group_ranks                     # groups of 8, 64, 1,024 and 4,096 ranks
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from diag import schema
from diag.trace import comm_line
from diag.trace.reader import read_file

P0 = 1_000_000_000


def _lines(ranks: int, steps: int, calls: int) -> list[str]:
    group = tuple(range(ranks))
    comm_line.new_file()
    out = []
    for step in range(steps):
        for i in range(calls):
            ts = P0 + (step * calls + i) * 1_000
            rec = (
                schema.COMM,
                step,
                "all_gather",
                4096 * (1 + i % 7),
                "bfloat16",
                "dp",
                ranks,
                group,
                ts,
                900,
                None,
                False,
            )
            out.append(comm_line.comm_text(rec, 900, 0))
    return out


def measure(ranks: int, steps: int, calls: int, always: bool) -> dict[str, float]:
    """Bytes, writer us and reader us a call; `always`: the ranks on every call (the old way)."""
    old = comm_line.ALWAYS
    comm_line.ALWAYS = 1 << 30 if always else old
    comm_line._PLANS.clear()
    try:
        _lines(ranks, 1, calls)  # (the plans made: a job's steady state)
        t0 = time.process_time()
        lines = _lines(ranks, steps, calls)
        write_s = time.process_time() - t0
    finally:
        comm_line.ALWAYS = old
        comm_line._PLANS.clear()
    n = steps * calls
    header = f'{{"k":"header","schema":1,"rank":0,"world_size":{ranks}}}\n'
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rank-00000.jsonl")
        with open(path, "w") as f:
            f.write(header + "\n".join(lines) + "\n")
        size = os.path.getsize(path)
        t0 = time.process_time()
        _, events, problems = read_file(path)
        read_s = time.process_time() - t0
    assert not problems and len(events) == n and all(len(e["group_ranks"]) == ranks for e in events)
    return {"bytes": size / n, "write_us": write_s / n * 1e6, "read_us": read_s / n * 1e6}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="8,64,1024,4096", help="group sizes, comma-separated")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--calls", type=int, default=200, help="calls of the group a step")
    args = p.parse_args(argv)
    print(f"{args.calls} calls a step x {args.steps} steps, one group; per call: every call -> once a step")
    print(f"{'ranks':>6} {'bytes':>17} {'ratio':>6} {'write us':>13} {'read us':>15} {'ratio':>6}")
    for ranks in (int(r) for r in args.ranks.split(",")):
        every = measure(ranks, args.steps, args.calls, True)
        once = measure(ranks, args.steps, args.calls, False)
        sizes = f"{every['bytes']:>8.0f} -> {once['bytes']:<6.0f} {every['bytes'] / once['bytes']:>6.1f}"
        print(
            f"{ranks:>6} {sizes}"
            f" {every['write_us']:>5.2f} -> {once['write_us']:<5.2f}"
            f" {every['read_us']:>6.1f} -> {once['read_us']:<6.1f} {every['read_us'] / once['read_us']:>6.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
