"""The benchmark's worker (runs on every rank under torchrun): one DeepSpeed job that trains in
short blocks, each block under one profiling variant switched on before it and off after it, in a
shuffled order per round that every rank draws from the same seed. Switching inside one process
keeps machine noise (other jobs on the box) the same for every variant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch.distributed as dist

from bench.overhead import SELF_SKIP
from tests.workloads import common, gpt_ds, shims
from tests.workloads.gpt import batch

NEVER = 10**9  # layers_every for "agent on, never sampled" (the always-on cost between samples)
FIRST_STEP = 1000
SELF_TIMED = "diag, not sampled, self-timed"  # also reports the agent's own time (hooks + writer)


@contextlib.contextmanager
def agent_on(trace_dir: str, layers_every: int, **options: Any) -> Iterator[None]:
    from diag import agent

    agent.start(trace_dir, layers_every=layers_every, **options)
    try:
        yield
    finally:
        agent.stop()


@contextlib.contextmanager
def torch_profiler() -> Iterator[None]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
        yield


@contextlib.contextmanager
def deepspeed_profilers(engine: Any) -> Iterator[None]:
    """DeepSpeed's flops profiler on the model and its comms logger on every collective."""
    from deepspeed.comm import comm
    from deepspeed.profiling.flops_profiler import FlopsProfiler

    prof = FlopsProfiler(engine.module, ds_engine=engine)
    prof.start_profile()
    comm.comms_logger.enabled = True
    try:
        yield
    finally:
        comm.comms_logger.enabled = False
        prof.stop_profile()
        prof.end_profile()


def own_ns() -> int:
    """The running agent's own CPU time so far: its hooks (self_time, less the timing's own share)
    plus its writer thread."""
    from diag import agent

    st = agent.current().status()  # type: ignore[union-attr]
    return int(st["hook_ns"] or 0) + int(st["writer_cpu_ns"])


def own_split() -> dict[str, int]:
    """`own_ns` by part: each collector's outermost hooks (step listeners are in `steps`) and the
    writer thread."""
    from diag import agent

    st = agent.current().status()  # type: ignore[union-attr]
    return {**(st["hook_ns_by"] or {}), "writer": int(st["writer_cpu_ns"])}


def variants(engine: Any, trace_dir: str) -> dict[str, Callable[[], Any]]:
    return {
        "bare": contextlib.nullcontext,
        "bare again (noise control)": contextlib.nullcontext,
        "diag, not sampled": lambda: agent_on(trace_dir, NEVER),
        SELF_TIMED: lambda: agent_on(trace_dir, NEVER, self_time=True),
        "diag per-layer (layers_every=1)": lambda: agent_on(trace_dir, 1),
        "diag per-layer, FLOPs every step": lambda: agent_on(trace_dir, 1, flops_every=1),
        "torch.profiler (CPU, record_shapes)": torch_profiler,
        "DeepSpeed flops profiler + comms logger": lambda: deepspeed_profilers(engine),
    }


def run_block(
    engine: Any,
    args: argparse.Namespace,
    rank: int,
    first: int,
    n: int,
    mark: Callable[[], Any] | None = None,
    mark_after: int = 1,
) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds of each step. CPU time (all threads: the agent's writer too) is
    what a variant adds in work; unlike wall time it does not grow when other jobs preempt us.
    `mark` runs after the first `mark_after` steps (the one that pays the switch, not counted)."""
    times = []
    for step in range(first, first + n):
        if mark is not None and step == first + mark_after:
            mark()
        t0, c0 = time.perf_counter(), time.process_time()
        tokens, targets = batch(step, rank, args.batch, args.seq, args.vocab)
        engine.backward(engine(tokens, targets))
        engine.step()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def main(argv: list[str]) -> NoReturn:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--block", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", required=True)
    ours, job = p.parse_known_args(argv)
    args = gpt_ds.parse_args([*job, "--comms-logger"])
    shims.deepspeed_cpu()
    rank, _ = common.init_process_group()
    engine, _, _ = gpt_ds.make_engine(args, rank)
    from deepspeed.comm import comm

    comm.comms_logger.enabled = False
    table = variants(engine, tempfile.mkdtemp(prefix="diag-bench-"))
    rng, step = random.Random(ours.seed), 0
    run_block(engine, args, rank, step, ours.block)  # warm-up
    step += ours.block
    # DeepSpeed numbers the steps from here (the agent's step numbers): past the job's first
    # `attribute_every` steps, which the agent tracks throughout, as a long run is
    engine.global_steps = FIRST_STEP
    times: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in table}
    own: list[int] = []  # the self-timed variant: the agent's own ns over each block's counted steps
    own_by: list[dict[str, int]] = []  # ... by part (collectors, writer)
    for _ in range(ours.rounds):
        order = list(table)
        rng.shuffle(order)
        for name in order:
            dist.barrier()
            with table[name]():
                start: list[tuple[int, dict[str, int]]] = []
                mark = (lambda at=start: at.append((own_ns(), own_split()))) if name == SELF_TIMED else None
                times[name].append(run_block(engine, args, rank, step, ours.block, mark, SELF_SKIP))
                if start:
                    own.append(own_ns() - start[0][0])
                    split = own_split()
                    own_by.append({k: v - start[0][1].get(k, 0) for k, v in split.items()})
            step += ours.block
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"times": times, "own_ns": own, "own_by": own_by})
    if rank == 0:
        with open(ours.result, "w") as f:
            json.dump(everyone, f)
    common.finish()


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
