"""What both workloads share: command-line flags, the agent on/off switch, the ground-truth collective
count from torch.profiler, and the result file rank 0 writes."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from tests.workloads import planted, truth


def base_parser(doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", help="rank 0 writes losses and ground truth here (JSON)")
    p.add_argument("--diag", action="store_true", help="run the diag agent in-process")
    p.add_argument("--trace-dir", default="diag-trace")
    p.add_argument("--what", default=None, help="collectors, comma-separated (default: all)")
    p.add_argument("--layers-every", type=int, default=None)
    p.add_argument(
        "--truth",
        action="store_true",
        help="count collectives with torch.profiler (ground truth for the tests)",
    )
    p.add_argument("--kineto", help="export one torch.profiler Chrome trace per rank to this folder")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep every step")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--detach-at",
        type=int,
        default=None,
        metavar="STEP",
        help="stop the agent from another thread during this step (+ rank: ranks detach at "
        "different moments, as `diag detach` does), --detach-delay s into it",
    )
    p.add_argument("--detach-delay", type=float, default=0.0)
    p.add_argument(
        "--log-iterations",
        action="store_true",
        help="print `iteration N` after each optimizer step (plain-torch workloads)",
    )
    return p


def add_size_args(p: argparse.ArgumentParser) -> None:
    """The GPT size knobs both workloads take (a huge --vocab makes the embedding-heavy variant)."""
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)


def add_slow_args(p: argparse.ArgumentParser) -> None:
    """A straggler planted in the job: one rank sleeps before every step's batch (the others wait
    for it in the step's collectives); with `--slow-on-usr2`, inside its forward (before its model's
    last leaf module, the LM head) from the step after it got SIGUSR2, sent from outside at a
    recorded time: a rank whose device degrades mid-run, in its compute, not its input (that is an
    input stall) and where a peer waits in a blocking collective (megatron-core TP's backward
    all-reduces are async: a peer's wait there is not told from its overlap)."""
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-on-usr2", action="store_true", help="slow compute once SIGUSR2 came")


class SlowRank:
    """`add_slow_args`' sleep on this rank: `before_batch` is called each step, `hook` once."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        mine = getattr(args, "slow_rank", None) == rank
        self.sleep_s = args.slow_ms / 1000 if mine else 0.0
        self.on_signal = getattr(args, "slow_on_usr2", False)
        self.armed = False
        if self.sleep_s and self.on_signal:
            signal.signal(signal.SIGUSR2, self._arm)

    def _arm(self, _sig: int, _frame: Any) -> None:
        self.armed = True

    def before_batch(self) -> None:
        if self.sleep_s and not self.on_signal:
            time.sleep(self.sleep_s)

    def hook(self, model: torch.nn.Module) -> None:
        """Sleep (once armed) before `model`'s last leaf module runs forward."""
        if self.sleep_s and self.on_signal:
            leaves = [m for m in model.modules() if not any(True for _ in m.children())]
            leaves[-1].register_forward_pre_hook(self._in_compute)

    def _in_compute(self, *_: Any) -> None:
        if self.armed:
            time.sleep(self.sleep_s)


def init_process_group() -> tuple[int, int]:
    """gloo on CPU, from torchrun's environment."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


@contextlib.contextmanager
def agent_if(args: argparse.Namespace) -> Iterator[Any]:
    """Start the diag agent around the block when `--diag` is given (rank-local, like `diag run`)."""
    if not args.diag:
        yield None
        return
    from diag import agent

    opts: dict[str, Any] = {}
    if args.layers_every is not None:
        opts["layers_every"] = args.layers_every
    handle = agent.start(args.trace_dir, what=args.what, **opts)
    try:
        yield handle
    finally:
        agent.stop()


def maybe_detach(args: argparse.Namespace, rank: int, step: int) -> None:
    """At the start of a loop step: on `--detach-at` + rank, stop the agent from a thread after
    `--detach-delay` s (the training thread is then inside the step, perhaps in a collective)."""
    if not args.diag or args.detach_at is None or step != args.detach_at + rank:
        return
    from diag import agent

    threading.Timer(args.detach_delay, agent.stop).start()


@contextlib.contextmanager
def profiled(args: argparse.Namespace, rank: int) -> Iterator[Any]:
    """torch.profiler around the block: `--truth` counts collectives, `--kineto` exports a trace."""
    if args.kineto:
        with truth.kineto(args.kineto, rank) as prof:
            yield prof
    elif args.truth:
        with truth.collectives() as counter:
            yield counter
    else:
        yield None


def train_loop(
    args: argparse.Namespace,
    prof: Any,
    opt: Any,
    loss_at: Callable[[int], torch.Tensor],
    model: torch.nn.Module,
) -> dict[str, Any]:
    """The loop of the plain-torch workloads: zero the grads, `loss_at(step)` (batch and forward),
    backward, optimizer step; every step's loss and wall time (`--step-sleep` included), and the
    wall clock (ns) right after each optimizer step: the job's own iteration `step` is its index."""
    losses, times, ends = [], [], []
    slow = SlowRank(args, dist.get_rank())
    slow.hook(model)
    faults = planted.Planted(args)
    for step in range(args.steps):
        t0 = time.perf_counter()
        slow.before_batch()
        opt.zero_grad(set_to_none=True)
        loss = loss_at(step)
        faults.after_forward(loss)
        loss.backward()
        opt.step()
        ends.append(time.time_ns())
        if args.log_iterations:
            print(f"iteration {step}", flush=True)
        losses.append(loss.item())
        if args.step_sleep:
            time.sleep(args.step_sleep)
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    return {"losses": losses, "step_times": times, "step_ends": ends}


def model_shape(args: argparse.Namespace) -> dict[str, Any]:
    """The GPT's size knobs as the result JSON records them (`model`), for the tests' own FLOP counts."""
    return {k: getattr(args, k) for k in ("vocab", "hidden", "layers", "heads", "seq", "batch")}


def write_result(args: argparse.Namespace, rank: int, mine: dict[str, Any], common: dict[str, Any]) -> None:
    """Gather every rank's `mine` (after the agent stopped, so it never sees this) and write JSON."""
    world = dist.get_world_size()
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0 and args.out:
        out = {**common, "world_size": world, "ranks": ranks, "losses": ranks[0]["losses"]}
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.out)


def finish(code: int = 0) -> NoReturn:
    """Leave the process group, then end the process without interpreter finalization.

    Why not a plain return: gloo's worker thread drops its last reference to a finished Work after
    the waiting caller has moved on. When that Work holds tensors whose Python objects outlive them
    (all_gather_object's buffers, captured by the final barrier's list of prior work), freeing them
    needs the GIL; a non-main thread asking for it during Py_FinalizeEx is ended by pthread_exit, and
    its forced unwind through the noexcept ~AsyncWork aborts the rank ("terminate called without an
    active exception", SIGABRT after a successful run: 1 run in 19 here, seen in a core dump)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    exit_now(code)


def exit_now(code: int = 0) -> NoReturn:
    """Run the atexit handlers (an attached diag agent stops and flushes in one), flush, _exit."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
