"""Step boundaries from a real 2-rank DeepSpeed job (gloo), a plain torch loop and Megatron's optimizer.

`run_ranks` / `train` are the shared harness of the steps, memory and overflow tests: forked ranks
rendezvous on a FileStore, train a tiny MLP under a given ds_config, and report what the engine saw.
"""

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

import diag
from diag import agent

WORLD = 2
JOB_TIMEOUT_S = 90


def run_ranks(tmp_path: Any, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run fn(rank, *args) in WORLD forked ranks with a gloo group; return each rank's JSON result."""
    import torch.multiprocessing as mp

    _warm_imports()

    ctx = mp.start_processes(_rank_main, (str(tmp_path), fn, args), nprocs=WORLD, join=False,
                             start_method="fork")
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

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(root, "store"), WORLD),
                            rank=rank, world_size=WORLD)
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
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage}, "steps_per_print": 10**6,
    }
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1,
                       "loss_scale_window": 1000}
    elif dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg.update(extra)
    return cfg


def train(rank: int, cfg: dict[str, Any], steps: int, trace: str | None = None,
          attach_at: int | None = None, inf_grad: tuple[int, int] | None = None,
          inf_loss: tuple[int, int] | None = None, **agent_opts: Any) -> dict[str, Any]:
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
    out.update(global_steps=engine.global_steps, skipped_steps=engine.skipped_steps,
               status=agent.current().status() if agent.current() else None)
    agent.stop()
    return out


def _attach_midrun(rank: int, trace: str) -> dict[str, Any]:
    return train(rank, ds_config(stage=1, gas=2), 8, trace=trace, attach_at=3,
                 what=("steps", "memory"))


@pytest.mark.slow
def test_deepspeed_steps_attached_midrun_number_like_the_job(tmp_path):
    trace = str(tmp_path / "trace")
    results = run_ranks(tmp_path, _attach_midrun, trace)
    tr = diag.load(trace)
    assert sorted(tr.headers) == [0, 1]
    for rank, res in enumerate(results):
        steps = tr.steps[tr.steps["rank"] == rank].sort_values("step")
        first = int(steps["step"].iloc[0])
        assert 3 <= first <= 5, first  # attached at global step 3, certainly installed by 5
        # one record per optimizer step (not per micro step, not twice), numbered like the engine
        assert list(steps["step"]) == list(range(first, res["global_steps"]))
        assert (steps["samples"] == 2 * 2 * WORLD).all()  # micro batch x grad accum x dp
        assert steps["applied"].all()
        durs = list(steps["dur"])
        assert math.isnan(durs[0]) or durs[0] is None  # the first step seen has no start
        assert all(d > 0 for d in durs[1:])
        assert tr.headers[rank]["zero_stage"] == 1 and tr.headers[rank]["gradient_accumulation_steps"] == 2
        mem = tr.memory[tr.memory["rank"] == rank]
        assert list(mem["step"]) == list(steps["step"])
        assert (mem["rss"] > 10 * 2**20).all() and (mem["device"] == "cpu").all()
        assert res["status"]["errors"] == {}


def _plain_loop(n: int) -> torch.nn.Module:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    return model


def test_plain_torch_loop_counts_optimizer_steps(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)
    ag = agent.start(str(tmp_path), what=("steps",))
    seen: list[int] = []
    ag.step_listeners.append(seen.append)
    _plain_loop(5)
    agent.stop()
    _plain_loop(2)  # after stop: nothing is counted any more
    steps = diag.load(str(tmp_path)).steps
    assert list(steps["step"]) == [0, 1, 2, 3, 4] and seen == [1, 2, 3, 4, 5]
    assert steps["applied"].all() and steps["samples"].isna().all()


def test_torch_hooks_wait_for_an_engine_while_deepspeed_is_loaded(tmp_path):
    import deepspeed.runtime.engine as ds_engine  # loaded, but this loop has no engine
    import torch.optim.optimizer as topt

    from collectors.steps import TORCH_GRACE

    cls = ds_engine.DeepSpeedEngine
    names = ("_take_model_step", "forward", "backward")
    before = [cls.__dict__[n] for n in names]
    agent.start(str(tmp_path), what=("steps", "overflow"))
    assert cls.__dict__["_take_model_step"] is not before[0] and topt._global_optimizer_post_hooks
    _plain_loop(TORCH_GRACE + 3)
    agent.stop()
    assert list(diag.load(str(tmp_path)).steps["step"]) == [0, 1, 2]
    assert [cls.__dict__[n] for n in names] == before and not topt._global_optimizer_post_hooks


def test_deepspeed_imported_after_install_is_patched_at_a_later_step(tmp_path, monkeypatch):
    import deepspeed.runtime.engine as ds_engine

    from collectors.steps import TORCH_GRACE

    cls = ds_engine.DeepSpeedEngine
    original = cls.__dict__["_take_model_step"]
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine")  # as if preloaded before the import
    agent.start(str(tmp_path), what=("steps", "overflow"))
    assert cls.__dict__["_take_model_step"] is original
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.engine", ds_engine)  # the job imports it
    _plain_loop(TORCH_GRACE + 1)
    patched = cls.__dict__["_take_model_step"]
    agent.stop()
    assert patched is not original and patched.__wrapped__.__wrapped__ is original  # steps + overflow
    assert cls.__dict__["_take_model_step"] is original


def test_megatron_optimizer_step_counted_once(tmp_path, monkeypatch):
    import megatron.core.optimizer.optimizer as mo
    from megatron.core.optimizer import OptimizerConfig

    monkeypatch.setattr(mo, "torch", _NoCudaTorch())  # its __init__ puts a scale tensor on 'cuda'
    model = torch.nn.Linear(4, 2)
    opt = mo.FP32Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), OptimizerConfig(clip_grad=0.0), None)
    original = mo.FP32Optimizer.__dict__["step"]
    agent.start(str(tmp_path), what=("steps",))
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()  # runs the torch SGD step inside: counted once, by the Megatron wrapper
    agent.stop()
    assert mo.FP32Optimizer.__dict__["step"] is original
    steps = diag.load(str(tmp_path)).steps
    assert list(steps["step"]) == [0, 1, 2] and steps["applied"].all()


class _NoCudaTorch:
    """torch as a module that has no GPU: `torch.tensor(..., device='cuda')` lands on the CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def tensor(self, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.tensor(*args, **kwargs)


def test_faults_never_reach_the_loop_and_are_counted(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)
    ag = agent.start(str(tmp_path), what=("steps",), faults={"steps": "raise"})
    torch.manual_seed(0)
    got = _plain_loop(4).weight.detach().clone()
    errors = dict(ag.errors)
    agent.stop()
    torch.manual_seed(0)
    assert torch.equal(got, _plain_loop(4).weight)  # same numerics as without the agent
    assert errors == {"steps:torch-post:InjectedFault": 4}
