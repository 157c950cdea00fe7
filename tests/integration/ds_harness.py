"""Shared harness of the DeepSpeed steps and overflow tests: forked ranks rendezvous on a FileStore,
train a tiny MLP under a given ds_config with DeepSpeed, and report what the engine saw. A module of
its own (not a test file) so that spawned ranks and several test files import it by name."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from diag import agent

WORLD = 2
JOB_TIMEOUT_S = 90


def run_ranks(tmp_path: Any, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run fn(rank, *args) in WORLD forked ranks with a gloo group; return each rank's JSON result."""
    import torch.multiprocessing as mp

    _warm_imports()

    ctx = mp.start_processes(
        _rank_main, (str(tmp_path), fn, args), nprocs=WORLD, join=False, start_method="fork"
    )
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"ranks still running after {JOB_TIMEOUT_S} s")
    out = []
    for rank in range(WORLD):
        with open(tmp_path / f"result-{rank}.json") as f:
            out.append(json.load(f))
    return out


def _warm_imports() -> None:
    """Import here, once, what every rank would otherwise import for itself (torch._dynamo via the
    first torch optimizer, DeepSpeed's optimizer modules): the forked ranks inherit it."""
    import deepspeed.runtime.bf16_optimizer
    import deepspeed.runtime.engine
    import deepspeed.runtime.fp16.unfused_optimizer
    import deepspeed.runtime.zero.muon.muon_optimizer
    import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401

    torch.optim.Adam(torch.nn.Linear(1, 1).parameters())


def _rank_main(rank: int, root: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="1",
    )
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=dist.FileStore(os.path.join(root, "store"), WORLD), rank=rank, world_size=WORLD
    )
    import deepspeed.comm.torch  # noqa: F401 - loads the module patched below
    from deepspeed.accelerator import get_accelerator

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # no 2-minute C++ build
    get_accelerator().is_fp16_supported = lambda: True
    try:
        result = fn(rank, *args)
    finally:
        agent.stop()
    with open(os.path.join(root, f"result-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def ds_config(stage: int = 0, dtype: str = "fp32", gas: int = 1, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**6,
    }
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1, "loss_scale_window": 1000}
    elif dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg.update(extra)
    return cfg


def train(
    rank: int,
    cfg: dict[str, Any],
    steps: int,
    trace: str | None = None,
    attach_at: int | None = None,
    inf_grad: tuple[int, int] | None = None,
    inf_loss: tuple[int, int] | None = None,
    **agent_opts: Any,
) -> dict[str, Any]:
    """Train `steps` optimizer steps; start the agent before the engine (attach_at None) or from a
    thread once engine.global_steps == attach_at. inf_*: (rank, step) to poison on that rank."""
    import deepspeed

    if trace is not None and attach_at is None:
        agent.start(trace, **agent_opts)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    dtype = next(engine.module.parameters()).dtype
    gen = torch.Generator().manual_seed(100 + rank)
    attacher: threading.Thread | None = None
    out: dict[str, Any] = {"losses": [], "scales": [], "applied": [], "attach_started": None}
    while engine.global_steps < steps:
        step = engine.global_steps
        if attach_at is not None and attacher is None and step == attach_at:
            attacher = threading.Thread(target=agent.start, args=(trace,), kwargs=agent_opts)
            attacher.start()
            out["attach_started"] = step
        if attacher is not None and step == attach_at + 2:
            attacher.join()  # started concurrently; certainly installed from here on
        x = torch.randn(2, 8, generator=gen).to(dtype)
        loss = (engine(x).float() - 1.0).pow(2).mean()
        if inf_loss == (rank, step):
            loss = loss * math.inf
        out["losses"].append(float(loss.detach()))
        engine.backward(loss)
        if inf_grad == (rank, step) and engine.is_gradient_accumulation_boundary():
            next(engine.module.parameters()).grad.view(-1)[0] = math.inf
        engine.step()
        if engine.global_steps != step:
            out["applied"].append(engine.was_step_applied())
            out["scales"].append(engine._get_optimizer_loss_scale() if engine.fp16_enabled() else None)
    out.update(
        global_steps=engine.global_steps,
        skipped_steps=engine.skipped_steps,
        status=agent.current().status() if agent.current() else None,
    )
    agent.stop()
    return out
