"""The few CPU-only shims the real workloads need (DESIGN.md, "measured facts"): they stand in for the
hardware boundary (CUDA) and skip a slow C++ build and a compiler back end's set-up, nothing else."""

from __future__ import annotations

import os
import sys


def eager_compile() -> None:
    """torch.compile's default back end set to eager in a job process: DeepSpeed's engine imports its
    Muon optimizer module (a type check of the job's optimizer) and megatron-core its fused
    functions, both decorating functions with torch.compile, and under the default Inductor each
    rank imported Inductor's lowering and built its kernel templates. Measured here, a rank's
    imports and first optimizer: DeepSpeed 5.2-5.4 -> 3.6-4.3 CPU s, megatron-core 5.3-5.6 ->
    4.2-4.3. These jobs never call a compiled function: the back end is never run."""
    import torch

    if hasattr(torch.compiler, "set_default_backend"):
        torch.compiler.set_default_backend("eager")


def deepspeed_cpu() -> None:
    """Let DeepSpeed run fp16 on CPU, skip the 2-minute `deepspeed_shm_comm` build and Inductor's
    set-up (`eager_compile`)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    eager_compile()
    import deepspeed.comm.torch  # noqa: F401 - the module whose build hook we replace
    from deepspeed.accelerator import get_accelerator

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    # the CPU accelerator refuses fp16; dynamic loss scaling itself runs fine on CPU
    get_accelerator().is_fp16_supported = lambda: True


def megatron_cpu() -> None:
    """torch.cuda calls megatron-core makes unconditionally, answered for a CPU-only process."""
    import torch

    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"
    cuda.synchronize = lambda *a, **k: None
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    cuda.manual_seed = lambda seed: None
    cuda.manual_seed_all = lambda seed: None


def megatron_pipeline_cpu() -> None:
    """megatron-core's pipeline schedules allocate their token counters with a literal
    `device="cuda"`: give the schedules module a `torch` whose tensor factories put "cuda" on the CPU
    (every other name is the real torch)."""
    import types

    import torch
    from megatron.core.pipeline_parallel import schedules

    class _CpuTorch(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            return getattr(torch, name)

    cpu = _CpuTorch("torch")
    for name in ("zeros", "ones", "empty", "tensor", "full"):
        real = getattr(torch, name)

        def factory(*a: object, _real: object = real, **k: object) -> object:
            if k.get("device") == "cuda":
                k["device"] = "cpu"
            return _real(*a, **k)  # type: ignore[operator]

        setattr(cpu, name, factory)
    schedules.torch = cpu
