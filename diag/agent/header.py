"""The trace header: who wrote this file, and the job's layout as far as it is known at start.

Fields learned later (the DeepSpeed engine is created after the agent started, the Megatron parallel
state is initialized) are written as `meta` events by `describe_job` and merged by the reader.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from diag.schema import MEGATRON_MODEL_ARGS, SCHEMA_VERSION

VERSIONS = {"torch": "torch", "deepspeed": "deepspeed", "megatron": "megatron.core"}  # header key: module


def _version(mod: str) -> str | None:
    m = sys.modules.get(mod)
    return getattr(m, "__version__", None) if m is not None else None


def late_versions(missing: dict[str, str]) -> dict[str, str]:
    """The versions of `missing` (header key: module) imported since the header was written, taken
    out of `missing`: under `diag run` the agent starts before the job imports torch or megatron, and
    a header without `megatron` hid megatron-core from the framework detection (Megatron-LM's
    run_simple_mcore_train_loop.py: null torch and megatron under `diag run`, known under attach)."""
    found = {key: v for key, mod in missing.items() if (v := _version(mod)) is not None}
    for key in found:
        del missing[key]
    return found


def rank_and_world() -> tuple[int | None, int | None]:
    """The global rank and world size: from torch.distributed once initialized, else torchrun's env."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a half-initialized group is not our problem
        pass
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    return (int(rank) if rank and rank.isdigit() else None, int(world) if world and world.isdigit() else None)


_JOB_ID_VARS = ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "TORCHELASTIC_RUN_ID")


def job_id() -> str | None:
    """The scheduler's job id (Slurm, LSF, PBS) or torchrun's rendezvous id: what tells two runs apart
    when their traces are analyzed together (`diag.importers.runs`)."""
    for var in _JOB_ID_VARS:
        v = os.environ.get(var, "").strip()
        if v and v.lower() != "none":  # torchrun's default run id is the literal "none"
            return f"{var}={v}"
    return None


def build_header(wall0_ns: int, perf0_ns: int, options: dict[str, Any]) -> dict[str, Any]:
    """The first line of a rank's trace file."""
    rank, world = rank_and_world()
    return {
        "k": "header",
        "schema": SCHEMA_VERSION,
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ["LOCAL_RANK"]) if os.environ.get("LOCAL_RANK", "").isdigit() else None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "job_id": job_id(),
        "python": sys.version.split()[0],
        **{key: _version(mod) for key, mod in VERSIONS.items()},
        "start_ts": wall0_ns,
        "start_wall": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(wall0_ns / 1e9)),
        "options": options,
        **describe_job(),
    }


MEGATRON_STATE = "megatron.core.parallel_state"


def megatron_layout() -> dict[str, Any]:
    ps = sys.modules.get(MEGATRON_STATE)
    if ps is None:
        return {}
    try:
        if not ps.model_parallel_is_initialized():
            return {}
        out: dict[str, Any] = {
            "tp": ps.get_tensor_model_parallel_world_size(),
            "pp": ps.get_pipeline_model_parallel_world_size(),
            "dp": ps.get_data_parallel_world_size(),
        }
        if hasattr(ps, "get_sequence_parallel_world_size"):  # Megatron-DeepSpeed's Ulysses degree
            out["sp"] = ps.get_sequence_parallel_world_size()
        # megatron-core's expert and context parallelism, where used: known at start, where the
        # comms collector names them only once a collective ran on their group
        for key, getter in (
            ("cp", "get_context_parallel_world_size"),
            ("ep", "get_expert_model_parallel_world_size"),
        ):
            size = getattr(ps, getter, lambda: 1)()
            if size > 1:
                out[key] = size
    except Exception:  # noqa: BLE001
        return {}
    model = megatron_model()
    if model:
        out["model"] = model
    return out


def megatron_model() -> dict[str, Any]:
    """The model shape Megatron's TFLOPs formula reads, from the job's parsed arguments (Megatron-LM's
    `megatron.training.global_vars`, Megatron-DeepSpeed's `megatron.global_vars`); {} without them."""
    for name in ("megatron.training.global_vars", "megatron.global_vars"):
        args = getattr(sys.modules.get(name), "_GLOBAL_ARGS", None)
        if args is not None:
            try:
                return {k: _jsonable(getattr(args, k)) for k in MEGATRON_MODEL_ARGS if hasattr(args, k)}
            except Exception:  # noqa: BLE001 - a property that raises: no model view
                return {}
    return {}


def _engine_info(engine: Any) -> dict[str, Any]:
    """ZeRO stage, dtype and the effective config of a live DeepSpeedEngine."""
    out: dict[str, Any] = {}
    try:
        out["zero_stage"] = int(engine.zero_optimization_stage())
        out["dtype"] = "fp16" if engine.fp16_enabled() else "bf16" if engine.bfloat16_enabled() else "fp32"
        cfg = getattr(engine, "_config", None)
        raw = getattr(cfg, "_param_dict", None)
        if isinstance(raw, dict):
            out["ds_config"] = _jsonable(raw)
        if cfg is not None:
            zc = getattr(cfg, "zero_config", None)
            if zc is not None and hasattr(zc, "model_dump"):
                out["zero_config"] = _jsonable(zc.model_dump())
        mpu = getattr(engine, "mpu", None)
        if mpu is not None:  # a PipelineEngine's grid: "model parallel" there is pp x tp, so ask for tp
            tp = getattr(mpu, "get_tensor_model_parallel_world_size", mpu.get_model_parallel_world_size)
            out.setdefault("tp", tp())
        stages = getattr(engine, "num_stages", None)  # DeepSpeed's PipelineEngine
        if isinstance(stages, int):
            out["pp"] = stages
            out["pipeline_engine"] = "deepspeed"  # its knobs, not Megatron-LM's (pipeline_bubble's fix)
        out["dp"] = getattr(engine, "dp_world_size", None)
        out["gradient_accumulation_steps"] = engine.gradient_accumulation_steps()
        out["train_micro_batch_size_per_gpu"] = engine.train_micro_batch_size_per_gpu()
    except Exception:  # noqa: BLE001 - partial info beats none
        pass
    return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def describe_job(engine: Any = None) -> dict[str, Any]:
    """Parallel layout and DeepSpeed settings known right now (empty fields are left out)."""
    info = megatron_layout()
    if engine is not None:
        info = {**_engine_info(engine), **info}
    return {k: v for k, v in info.items() if v is not None}
