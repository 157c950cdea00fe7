"""Train the small GPT with DeepSpeed on CPU/gloo: `torchrun --nproc_per_node=2 -m tests.workloads.gpt_ds`.

Deterministic (fixed seeds and data), so losses are comparable bit for bit between runs with and
without the agent. Faults on request: a forced inf in a gradient (fp16 overflow), a slow rank.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any, NoReturn

import torch

from tests.workloads import common, shims
from tests.workloads.gpt import GPT, batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.base_parser(__doc__)
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0)
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--overflow-at", default="", help="steps (comma list) that get an inf gradient")
    p.add_argument("--overflow-rank", type=int, default=0)
    common.add_slow_args(p)
    common.add_size_args(p)
    p.add_argument(
        "--comms-logger",
        action="store_true",
        help="enable DeepSpeed's comms logger (ground truth for deepspeed.comm bytes)",
    )
    p.add_argument(
        "--flops-profiler",
        type=int,
        default=None,
        metavar="STEP",
        help="enable DeepSpeed's flops profiler on this step (the benchmark's baseline)",
    )
    p.add_argument("--log-level", default="warning", help="DeepSpeed's log level (info shows OVERFLOW!)")
    p.add_argument(
        "--steps-per-print",
        type=int,
        default=10**9,
        help="DeepSpeed's `step=N` progress lines every N steps (with --log-level info)",
    )
    return p.parse_args(argv)


def ds_config(args: argparse.Namespace) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.zero},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": args.steps_per_print,
        "log_level": args.log_level,
    }
    if args.comms_logger:
        cfg["comms_logger"] = {"enabled": True, "prof_all": True, "verbose": False, "debug": False}
    if args.flops_profiler is not None:
        cfg["flops_profiler"] = {
            "enabled": True,
            "profile_step": args.flops_profiler,
            "module_depth": -1,
            "top_modules": 1,
            "detailed": False,
        }
    if args.dtype == "fp16":
        cfg["fp16"] = {
            "enabled": True,
            "initial_scale_power": 8,
            "loss_scale_window": 1000,
            "hysteresis": 1,
            "min_loss_scale": 1,
        }
    elif args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def loss_scale(engine: Any) -> float | None:
    """The dynamic loss scale where this DeepSpeed version keeps it (None when not fp16)."""
    opt = engine.optimizer
    for holder in (getattr(opt, "loss_scaler", None), getattr(opt, "loss_scale_config", None), opt):
        scale = getattr(holder, "cur_scale", None)
        if scale is not None:
            return float(scale)
    return None


def ds_comms() -> dict[str, dict[str, int]]:
    """DeepSpeed's comms logger totals: {op: {"count", "bytes"}} (what went through deepspeed.comm)."""
    from deepspeed.comm import comm

    out: dict[str, dict[str, int]] = {}
    for name, sizes in comm.comms_logger.comms_dict.items():
        tot = out.setdefault(name, {"count": 0, "bytes": 0})
        for size, rec in sizes.items():
            tot["count"] += rec[0]
            tot["bytes"] += rec[0] * int(size)
    return out


def overflow_hook(model: GPT, steps: set[int], state: dict[str, int]) -> None:
    """Put an inf into ln_f.weight's gradient on the chosen steps (before DeepSpeed reduces it)."""

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if state["step"] not in steps:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = math.inf
        return grad

    model.ln_f.weight.register_hook(hook)


def make_engine(args: argparse.Namespace, rank: int) -> tuple[Any, GPT, dict[str, int]]:
    import deepspeed

    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.hidden, args.layers, args.seq, args.heads)
    state = {"step": -1}
    bad = {int(s) for s in args.overflow_at.split(",") if s.strip()}
    if bad and rank == args.overflow_rank:
        overflow_hook(model, bad, state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(args))
    return engine, model, state


def train(args: argparse.Namespace, rank: int, prof: Any) -> dict[str, Any]:
    engine, _, state = make_engine(args, rank)
    dtype = {"fp16": torch.half, "bf16": torch.bfloat16}.get(args.dtype)
    losses, scales, times = [], [], []
    iterations, skipped = [], []  # the job's own numbering, as its log would show it
    slow = common.SlowRank(args, rank)
    slow.hook(engine.module)
    for step in range(args.steps):
        state["step"] = step
        common.maybe_detach(args, rank, step)
        t0 = time.perf_counter()
        slow.before_batch()
        tokens, targets = batch(step, rank, args.batch, args.seq, args.vocab)
        loss = engine(tokens, targets)
        engine.backward(loss)
        skipped_before = engine.skipped_steps
        engine.step()
        iterations.append(int(engine.global_steps))  # DeepSpeed logs `step=N`, Megatron `iteration N`
        if engine.skipped_steps != skipped_before:
            skipped.append(int(engine.global_steps))
        if args.log_iterations:
            print(f"iteration {step}", flush=True)
        losses.append(loss.item())
        scales.append(loss_scale(engine) if dtype is torch.half else None)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    return {
        "losses": losses,
        "loss_scale": scales,
        "step_times": times,
        "skipped_steps": int(engine.skipped_steps),
        "global_steps": int(engine.global_steps),
        "iterations": iterations,
        "skipped_iterations": skipped,
    }


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    shims.deepspeed_cpu()
    rank, _ = common.init_process_group()
    with common.agent_if(args), common.profiled(args, rank) as prof:
        mine = train(args, rank, prof)
    if args.truth and prof is not None:
        mine["truth_comms"] = prof.as_dict()
    if args.comms_logger:
        mine["ds_comms"] = ds_comms()
    common.write_result(
        args,
        rank,
        mine,
        {
            "workload": "gpt_ds",
            "zero": args.zero,
            "dtype": args.dtype,
            "steps": args.steps,
            "model": common.model_shape(args),
            "overflow_at": args.overflow_at,
            "overflow_rank": args.overflow_rank,
        },
    )
    common.finish()


if __name__ == "__main__":
    main()
