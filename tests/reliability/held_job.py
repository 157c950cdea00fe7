"""The real 2-rank DeepSpeed GPT job of tests/workloads/gpt_ds.py, held open for the reliability tests.

`torchrun --nproc_per_node=2 -m tests.reliability.held_job [gpt_ds flags] --release FILE --progress FILE`

It trains at most `--steps` steps; with `--release` it stops early, at a step boundary both ranks
agree on, once FILE exists, so a test can attach, inspect and detach while it trains. Losses are
therefore always a prefix of an untouched run with the same flags. Rank 0 writes the number of
finished steps to `--progress`. At the end every rank records, from inside the process, what diag
could have left behind: thread names, open file descriptors, global and per-module hook counts,
profile/trace functions and any callable of torch / DeepSpeed still wrapped by diag.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from tests.workloads import common, gpt_ds, shims
from tests.workloads.gpt import batch


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--release", default=None, help="stop at the next step boundary once this exists")
    own.add_argument("--progress", default=None, help="rank 0 writes the finished step count here")
    mine, rest = own.parse_known_args(argv)
    args = gpt_ds.parse_args(rest)
    args.release, args.progress = mine.release, mine.progress
    return args


def released(args: argparse.Namespace) -> bool:
    """Both ranks agree (MAX over ranks) whether the release file exists: one all_reduce per step."""
    if args.release is None:
        return False
    flag = torch.tensor([float(os.path.exists(args.release))])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def train(args: argparse.Namespace, rank: int) -> tuple[dict[str, Any], torch.nn.Module]:
    """gpt_ds's loop (same engine, same data) with an early, agreed stop."""
    engine, model, state = gpt_ds.make_engine(args, rank)
    losses = []
    for step in range(args.steps):
        state["step"] = step
        tokens, targets = batch(step, rank, args.batch, args.seq, args.vocab)
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if args.progress and rank == 0:
            with open(args.progress + ".tmp", "w") as f:
                f.write(str(step + 1))
            os.replace(args.progress + ".tmp", args.progress)
        if args.step_sleep:
            import time

            time.sleep(args.step_sleep)
        if released(args):
            break
    return {"losses": losses, "skipped_steps": int(engine.skipped_steps)}, model


def _ours(value: Any) -> bool:
    return str(getattr(value, "__module__", "") or "").startswith(("diag", "collectors"))


def fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """Everything an agent could leak, read from inside this process."""
    import torch.nn.modules.module as M

    spaces: dict[str, Any] = {
        "Module": torch.nn.Module,
        "Optimizer": torch.optim.Optimizer,
        "dist": dist,
        "c10d": dist.distributed_c10d,
        "ProcessGroup": torch._C._distributed_c10d.ProcessGroup,
    }
    for name in ("deepspeed.runtime.engine", "deepspeed.comm.comm", "deepspeed.comm.torch"):
        if name in sys.modules:
            spaces[name] = sys.modules[name]
    engine_cls = getattr(sys.modules.get("deepspeed.runtime.engine"), "DeepSpeedEngine", None)
    if engine_cls is not None:
        spaces["DeepSpeedEngine"] = engine_cls
    wrapped = sorted(
        f"{ns}.{k}" for ns, obj in spaces.items() for k, v in vars(obj).items() if callable(v) and _ours(v)
    )
    agent = sys.modules.get("diag.agent")
    return {
        "threads": sorted(t.name for t in threading.enumerate()),
        "fds": len(os.listdir("/proc/self/fd")),
        "global_hooks": {
            n: [getattr(h, "__qualname__", repr(h)) for h in getattr(M, n).values()]
            for n in dir(M)
            if n.startswith("_global_") and n.endswith("hooks")
        },
        "module_hooks": sum(
            len(v)
            for m in model.modules()
            for n, v in vars(m).items()
            if n.endswith("hooks") and hasattr(v, "__len__")
        ),
        "wrapped": wrapped,
        "profile": repr(sys.getprofile()),
        "trace": repr(sys.gettrace()),
        "agent_running": bool(agent is not None and agent.current() is not None),
    }


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    shims.deepspeed_cpu()
    rank, _ = common.init_process_group()
    with common.agent_if(args):
        mine, model = train(args, rank)
    mine["fingerprint"] = fingerprint(model)
    common.write_result(args, rank, mine, {"workload": "held_job", "steps": args.steps})
    common.finish()


if __name__ == "__main__":
    main()
