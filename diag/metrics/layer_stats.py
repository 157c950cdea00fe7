"""Per-module figures of a diag trace's sampled steps: the leaf modules and the top ones by time."""

from __future__ import annotations

import pandas as pd

COLUMNS = ["module", "steps", "fwd_ms", "bwd_ms", "flops", "tflops", "mfu", "mem_delta"]


def leaf_layers(layers: pd.DataFrame) -> pd.DataFrame:
    """Layer records of modules without children (parents' records are inclusive of them). The root
    is named by its class, not as a prefix of its children: it is the one with the most FLOPs."""
    names = set(layers["module"].astype(str))
    leaves = {n for n in names if not any(o.startswith(n + ".") for o in names)}
    if len(leaves) > 1:
        leaves.discard(str(layers.groupby("module", observed=True)["flops"].sum().idxmax()))
    return layers[layers["module"].astype(str).isin(leaves)]


def top_layers(layers: pd.DataFrame, peak_tflops: float | None, top: int = 10) -> pd.DataFrame:
    """The `top` leaf modules, each from the lowest rank that ran it, by time per sampled step:
    forward and backward ms, FLOPs, FLOP/s over its own time, MFU, and the mean allocated-memory
    change of its forward (CUDA only; None on CPU). Each module's own lowest rank, not the job's:
    under pipeline parallelism a stage's layers run on its ranks only (Megatron-DeepSpeed PP=2: the
    table showed stage 0 alone, without the logits and layer 1, 68% of the FLOPs)."""
    if layers.empty:
        return pd.DataFrame(columns=COLUMNS)
    lay = layers[layers["rank"] == layers.groupby("module", observed=True)["rank"].transform("min")]
    leaf = leaf_layers(lay)
    leaf = leaf.assign(module=leaf["module"].astype(str), phase=leaf["phase"].astype(str))
    steps = leaf.groupby("module")["step"].nunique().clip(lower=1)
    dur = leaf.pivot_table(index="module", columns="phase", values="dur", aggfunc="sum").fillna(0)
    dur = dur.div(steps.reindex(dur.index), axis=0)
    out = pd.DataFrame({"fwd_ms": dur.get("fwd", 0) / 1e6, "bwd_ms": dur.get("bwd", 0) / 1e6})
    out["flops"] = pd.to_numeric(leaf["flops"], errors="coerce").groupby(leaf["module"]).sum() / steps
    secs = (out["fwd_ms"] + out["bwd_ms"]) / 1e3
    out["tflops"] = (out["flops"] / secs.where(secs > 0) / 1e12).where(out["flops"] > 0)
    out["mfu"] = out["tflops"] / peak_tflops if peak_tflops else None
    fwd = leaf[leaf["phase"] == "fwd"]
    out["mem_delta"] = pd.to_numeric(fwd["mem_delta"], errors="coerce").groupby(fwd["module"]).mean()
    out["steps"] = steps.reindex(out.index)
    out = out.assign(_t=out["fwd_ms"] + out["bwd_ms"]).sort_values("_t", ascending=False).head(top)
    return out.drop(columns="_t").rename_axis("module").reset_index()[COLUMNS]
