"""Config differences between the runs (layout and effective ds_config from the trace headers),
each tied to the waterfall labels it plausibly moves, so the report shows them beside those deltas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diag.diff import align
from diag.diff.split import COMPUTE, IDLE, OPTIMIZER, SKIPPED

if TYPE_CHECKING:
    from diag.trace.model import Trace

_LAYOUT = (
    "world_size",
    "tp",
    "pp",
    "dp",
    "zero_stage",
    "dtype",
    "gradient_accumulation_steps",
    "train_micro_batch_size_per_gpu",
)
COMM = "comm:"
# key prefix -> the waterfall labels (or label families) it moves
_AFFECTS: list[tuple[str, tuple[str, ...]]] = [
    ("zero_stage", (COMM, COMPUTE, OPTIMIZER)),
    ("zero_optimization", (COMM, OPTIMIZER)),
    ("tp", (COMM, COMPUTE)),
    ("pp", (COMM, IDLE)),
    ("dp", (COMM,)),
    ("world_size", (COMM,)),
    ("dtype", (COMPUTE, SKIPPED)),
    ("bf16", (COMPUTE, SKIPPED)),
    ("fp16", (COMPUTE, SKIPPED)),
    ("train_micro_batch_size_per_gpu", (COMPUTE,)),
    ("train_batch_size", (COMPUTE,)),
    ("gradient_accumulation_steps", (COMPUTE, COMM)),
    ("optimizer", (OPTIMIZER,)),
    ("communication_data_type", (COMM,)),
    ("activation_checkpointing", (COMPUTE,)),
]


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def settings(trace: Trace) -> dict[str, Any]:
    """Layout keys and the effective ds_config, flattened to dotted keys."""
    header = trace.headers[trace.ranks[0]] if trace.ranks else {}
    lay = {**header, **align.layout(trace)}
    out = {k: lay[k] for k in _LAYOUT if lay.get(k) is not None}
    if isinstance(lay.get("ds_config"), dict):
        out.update(_flat(lay["ds_config"], "ds_config."))
    return out


def affects(key: str) -> list[str]:
    bare = key.removeprefix("ds_config.")
    for prefix, labels in _AFFECTS:
        if bare == prefix or bare.startswith(prefix + ".") or bare.startswith(prefix + "_"):
            return list(labels)
    return []


def differences(a: Trace, b: Trace) -> list[dict[str, Any]]:
    """[{key, baseline, candidate, affects}] for every setting that differs (absent = None)."""
    sa, sb = settings(a), settings(b)
    return [
        {"key": k, "baseline": sa.get(k), "candidate": sb.get(k), "affects": affects(k)}
        for k in sorted(set(sa) | set(sb))
        if sa.get(k) != sb.get(k)
    ]
