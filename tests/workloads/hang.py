"""A real hang for `diag stacks`: 2-rank gloo job where one rank skips a collective.

Every step each rank does one all_reduce. At step --hang-at, rank --skip-rank skips it and then
blocks in `wait_for_data()` (a stuck data loader, say), so the other rank waits in all_reduce
forever. Both ranks exit on their own after --max-wait seconds so a failed test leaks nothing.
Run: torchrun --nproc_per_node=2 -m tests.workloads.hang --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def wait_for_data(seconds: float) -> None:
    """Where the skipping rank sits: the stack `diag stacks` must point at."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


def mark(out: str, rank: int, text: str) -> None:
    with open(os.path.join(out, f"rank-{rank}.state"), "w") as f:
        f.write(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--hang-at", type=int, default=5)
    parser.add_argument("--skip-rank", type=int, default=1)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--max-wait", type=float, default=120.0)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.max_wait))
    rank = dist.get_rank()
    grad = torch.ones(1024)
    for step in range(args.hang_at + 1):
        if step == args.hang_at:
            mark(args.out, rank, f"hang {step}")
            if rank == args.skip_rank:
                wait_for_data(args.max_wait)
                os._exit(0)
        dist.all_reduce(grad)
        time.sleep(args.step_sleep)
    dist.destroy_process_group()  # not reached by the waiting rank before the timeout


if __name__ == "__main__":
    main()
