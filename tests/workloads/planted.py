"""Faults a workload plants in itself, for the fault matrix (tests/integration/faults_extra.py).

- desync (`--desync-rank R`): every rank all-reduces its loss each step (the usual average for
  logging); once the rank gets SIGUSR1 (sent from outside, at a recorded time), it calls a broadcast
  of the same tensor instead at its next step: one rank issues a different collective than its group,
  a rank-dependent branch around a collective. On gloo the two calls never match: both ranks hang.
- memory growth (`--leak-rank R --leak-mb N`): the rank keeps an N MiB tensor every step, as a job
  that appends per-step tensors to a list (losses kept with their graph, a cache never cleared).
- a compute straggler (`--compute-slow-rank R --compute-slow-ms N`): the rank sleeps between its
  forward and backward, inside its compute, not before the batch as `--slow-rank` (an input stall).
"""

from __future__ import annotations

import argparse
import signal
import time
from typing import Any

import torch
import torch.distributed as dist


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--desync-rank", type=int, default=None, help="SIGUSR1 makes it broadcast, not all-reduce")
    p.add_argument("--leak-rank", type=int, default=None)
    p.add_argument("--leak-mb", type=float, default=0.0, help="MiB the leaking rank keeps every step")
    p.add_argument("--compute-slow-rank", type=int, default=None)
    p.add_argument("--compute-slow-ms", type=float, default=0.0, help="sleep between forward and backward")


class Planted:
    """The faults of `args` for this rank, called once a step by the training loop."""

    def __init__(self, args: argparse.Namespace) -> None:
        rank = dist.get_rank()
        self.sync_loss = getattr(args, "desync_rank", None) is not None
        self.desync_here = self.sync_loss and args.desync_rank == rank
        self.armed = False
        if self.desync_here:
            signal.signal(signal.SIGUSR1, self._arm)
        leak = getattr(args, "leak_rank", None) == rank
        self.leak_numel = int(args.leak_mb * 2**20 / 4) if leak else 0
        self.kept: list[torch.Tensor] = []
        slow = getattr(args, "compute_slow_rank", None) == rank
        self.compute_sleep_s = args.compute_slow_ms / 1000 if slow else 0.0

    def _arm(self, _sig: int, _frame: Any) -> None:
        self.armed = True

    def after_forward(self, loss: torch.Tensor) -> None:
        """The slow compute, the loss collective (a broadcast on the desynced rank once armed), the leak."""
        if self.compute_sleep_s:
            time.sleep(self.compute_sleep_s)
        if self.sync_loss:
            t = loss.detach().clone()
            if self.armed:
                dist.broadcast(t, src=0)
            else:
                dist.all_reduce(t)
        if self.leak_numel:
            self.kept.append(torch.ones(self.leak_numel))  # touched: resident, not only reserved
