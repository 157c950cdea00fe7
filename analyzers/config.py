"""The job's DeepSpeed settings as it ran them: the engine's effective config, then the user's
ds_config, then DeepSpeed's code defaults (which differ from its docs, DESIGN.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.trace.model import Trace

# DeepSpeed's code defaults: the rules read the engine's effective config first and fall back to these.
DS_DEFAULTS: dict[str, Any] = {
    "stage3_prefetch_bucket_size": 5e7,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "stage3_param_persistence_threshold": 1e5,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


def ds_config(trace: Trace) -> dict[str, Any]:
    cfg = trace.layout().get("ds_config")
    return cfg if isinstance(cfg, dict) else {}


def zero_config(trace: Trace) -> dict[str, Any]:
    """The effective zero config: the engine's dump when recorded, else the user's ds_config section."""
    for rank in trace.ranks:
        zc = trace.headers[rank].get("zero_config")
        if isinstance(zc, dict):
            return zc
    zo = ds_config(trace).get("zero_optimization")
    return zo if isinstance(zo, dict) else {}


def zero_stage(trace: Trace) -> int:
    stage = trace.layout().get("zero_stage")
    if stage is None:
        stage = zero_config(trace).get("stage", 0)
    try:
        return int(stage)
    except (TypeError, ValueError):
        return 0


def setting(trace: Trace, key: str) -> Any:
    """A ZeRO / fp16 setting as the job ran it: effective config, then ds_config, then code default
    (a key present but null counts as absent), so rules need no fallback of their own."""
    zc = zero_config(trace)
    for name in (key, key.removeprefix("stage3_")):  # the engine's dump uses field names, not aliases
        if zc.get(name) is not None:
            return zc[name]
    fp16 = ds_config(trace).get("fp16")
    if isinstance(fp16, dict) and fp16.get(key) is not None:
        return fp16[key]
    if key == "overlap_comm":
        return zero_stage(trace) == 3  # the code default: true only for stage 3
    return DS_DEFAULTS.get(key)
