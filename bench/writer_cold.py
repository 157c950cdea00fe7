"""The writer thread's flush as a job sees it: cold. CPU time of `Agent._flush` on real records
(a one-rank gloo job: collectives, steps, memory), each flush after the "job's compute" (a pass over
64 MiB) has evicted the writer's code and data from the caches, as a training step does between
two flushes. Where bench/hooks_probe's writer figure also moves with the step time (the flushes per
step), this one holds the records per flush fixed, so two trees can be compared on a loaded host:

    python -m bench.writer_cold                       # this tree
    python -m bench.writer_cold --against /path/to/old/tree --rounds 4

`--against` runs this module from each tree in turn (the old tree needs `diag/collectors` and
`diag/analyzers` linked to its `collectors/` and `analyzers/`) and prints both and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVICT_BYTES = 64 << 20


def measure(flushes: int, steps_per_flush: int, warm: bool) -> tuple[float, float]:
    """(median CPU us per flush, records per flush) over `flushes` timed flushes."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from diag.agent import runtime

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    runtime.FLUSH_INTERVAL_S = 3600.0  # the writer thread sleeps: this process flushes by hand
    from diag import agent

    ag = agent.start(tempfile.mkdtemp(prefix="diag-cold-"), what="steps,comms,memory", layers_every=10**9)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    junk = np.ones(EVICT_BYTES // 8)
    clock = time.thread_time_ns
    per: list[int] = []
    records: list[int] = []
    for n in range(flushes + 3):
        for _ in range(steps_per_flush):
            opt.zero_grad()
            model(x).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
        if not warm:
            junk += 1.0  # the job's compute: the caches hold its data now, not the writer's
        waiting = len(ag.ring)
        t0 = clock()
        ag._flush(final=False)
        spent = clock() - t0
        if n >= 3:  # the first flushes make the plans (compiled once per record shape)
            per.append(spent)
            records.append(waiting)
    agent.stop()
    dist.destroy_process_group()
    return statistics.median(per) / 1e3, statistics.mean(records)


def _run(tree: str, args: argparse.Namespace) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "bench.writer_cold", "--flushes", str(args.flushes)]
    cmd += ["--steps-per-flush", str(args.steps_per_flush)] + (["--warm"] if args.warm else [])
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=True)
    last = out.stdout.strip().splitlines()[-1].split()
    return float(last[0]), float(last[1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.writer_cold")
    p.add_argument("--flushes", type=int, default=60)
    p.add_argument("--steps-per-flush", type=int, default=3)
    p.add_argument("--warm", action="store_true", help="no eviction between flushes")
    p.add_argument("--against", help="another tree to compare with (run alternately)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if not args.against:
        us, recs = measure(args.flushes, args.steps_per_flush, args.warm)
        print(f"{us:.1f} {recs:.1f}  (median CPU us per flush, records per flush)")
        return 0
    old: list[float] = []
    new: list[float] = []
    for _ in range(args.rounds):
        for tree, into in ((args.against, old), (ROOT, new)):
            us, recs = _run(tree, args)
            into.append(us)
            name = "old" if into is old else "new"
            print(f"  {name} {us:7.1f} us per flush ({recs:.0f} records)", flush=True)
    o, n = statistics.median(old), statistics.median(new)
    how = "warm" if args.warm else "cold"
    print(f"writer flush, {how}: old {o:.1f} us, new {n:.1f} us, new/old {n / o:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
