"""The few CPU-only shims the real workloads need (DESIGN.md, "measured facts"): they stand in for the
hardware boundary (CUDA) and skip a slow C++ build, nothing else."""

from __future__ import annotations

import os
import sys


def deepspeed_cpu() -> None:
    """Let DeepSpeed run fp16 on CPU and skip the 2-minute `deepspeed_shm_comm` build."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
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
