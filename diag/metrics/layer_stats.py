"""Per-module figures of a diag trace's sampled steps: the leaf modules and the top ones by time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diag import schema
from diag.metrics import layer_sums, positions

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace


def renumber(name: str, numbers: dict[str, int]) -> str:
    """`decoder.layers.0.mlp` -> `decoder.layers.2.mlp` when the agent recorded that this rank's
    `decoder.layers.0` is layer 2 of the whole model (a pipeline stage's local numbering)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        index = numbers.get(".".join(parts[:i]))
        if index is not None:
            parts[i - 1] = str(index)
            return ".".join(parts)
    return name


def global_layer_names(trace: Trace, lay: pd.DataFrame) -> pd.Series:
    """Each record's module name with pipeline stages' local layer indices made model-wide, from the
    rank's `layer_numbers` meta (see collectors/modules.py)."""
    numbers = {r: h.get(schema.META_LAYER_NUMBERS) for r, h in trace.headers.items()}
    names = lay["module"].astype(str)
    if not any(isinstance(v, dict) and v for v in numbers.values()):
        return names
    pairs = {(m, r): renumber(m, numbers.get(r) or {}) for m, r in set(zip(names, lay["rank"]))}
    return pd.Series([pairs[(m, r)] for m, r in zip(names, lay["rank"])], index=lay.index)


def model_wide_layers(trace: Trace) -> pd.DataFrame:
    """The trace's layer records named model-wide: megatron-core numbers each pipeline stage's layers
    from 0, so without this the second stage's `decoder.layers.0` reads as the first stage's and one
    of the two is dropped as a shard of the other (Megatron-LM's run_simple_mcore_train_loop.py at
    PP=2: the top-layers table showed stage 0's decoder layer only)."""
    lay = trace.layers
    if lay.empty or "module" not in lay.columns:
        return lay
    return lay.assign(module=global_layer_names(trace, lay))


def steady_samples(layers: pd.DataFrame, steady: pd.DataFrame) -> pd.DataFrame:
    """`layers` on each rank's steady steps (`steady`: rank, step; `Metrics.steady_steps`) where it
    sampled one, else all of its records, with a column `warmup`: the record's step is not steady.
    The first steps are the warm-up (lazy set-up, the first collectives' connections): Megatron-LM's
    run_simple_mcore_train_loop.py at TP=2, 12 steps, sampled step 0 alone and its table gave rank
    0's embedding forward 115.7 ms, 111.6 of them waiting in its first all_reduce; its step 1 took
    609 ms where steady ones took 90. The agent also samples the first steady step
    (diag/agent/runtime.py), so a run of three steps or more has a steady sample."""
    if layers.empty:
        return layers.assign(warmup=False)
    warm, keep = steady_rows(layers, steady)
    return layers.assign(warmup=warm)[keep]


def steady_rows(layers: pd.DataFrame, steady: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(`warmup` of each record, the records `steady_samples` keeps), one rank's records at a time:
    a (rank, step) index of every record took +80 MiB at 64 ranks x 1,000 steps. The steady steps
    looked at are those of the records' span of steps (a window's are a few of the job's: each
    window grouped every steady step of a 256-rank x 500-step job, the windowed pass's peak)."""
    rank = layers["rank"].astype("int64").to_numpy()
    step = layers["step"].astype("int64").to_numpy()
    steady = steady[steady["step"].between(step.min(), step.max()).to_numpy()]  # (others: no record)
    steady_steps = {
        int(r): np.unique(g.to_numpy()) for r, g in steady["step"].astype("int64").groupby(steady["rank"])
    }
    warm = np.ones(len(layers), dtype=bool)
    keep = np.ones(len(layers), dtype=bool)
    for rows in positions.by_rank(pd.factorize(rank, sort=True)[0]):
        mine = steady_steps.get(int(rank[rows][0]))
        if mine is not None:
            warm[rows] = ~np.isin(step[rows], mine)
        if not warm[rows].all():  # a rank with a steady sample: its warm-up records are left out
            keep[rows] = ~warm[rows]
    return warm, keep


def leaf_layers(layers: pd.DataFrame) -> pd.DataFrame:
    """Layer records of modules without children (`layer_sums.leaf_names`: the root, named by its
    class, is the module with the most FLOPs)."""
    names = layers["module"].astype(str)
    return layers[names.isin(layer_sums.leaf_names(layers["flops"].groupby(names).sum()))]


def top_layers(layers: pd.DataFrame, peak_tflops: float | None, top: int = 10) -> pd.DataFrame:
    """The `top` leaf modules, each from the lowest rank that ran it, by time per sampled step
    (`layer_sums.table`; `warmup`: a column `steady_samples` adds). Each module's own lowest rank,
    not the job's: under pipeline parallelism a stage's layers run on its ranks only
    (Megatron-DeepSpeed PP=2: the table showed stage 0 alone, without the logits and layer 1, 68%
    of the FLOPs)."""
    warm = layers["warmup"].to_numpy(dtype=bool) if "warmup" in layers else np.zeros(len(layers), dtype=bool)
    return layer_sums.table(layer_sums.lowest(layer_sums.of_records(layers, warm)), peak_tflops, top)


def steady_sums(layers: pd.DataFrame, steady: pd.DataFrame) -> layer_sums.Sums:
    """`layer_sums.Sums` of `layers`, the records of steps not in `steady` (`Metrics.steady_steps`)
    marked warm-up."""
    if layers.empty:
        return layer_sums.EMPTY
    return layer_sums.of_records(layers, steady_rows(layers, steady)[0])


@dataclass(frozen=True)
class LayerSums:
    """The trace's layer records named model-wide (`model_wide_layers`), summed (`steady_sums` on
    the whole trace's steady steps, a window's too: `window_metrics.of_window`)."""

    def of(self, metrics: Metrics) -> layer_sums.Sums:
        return steady_sums(model_wide_layers(metrics.trace), metrics.steady_steps)

    def merged(self, parts: list[layer_sums.Sums]) -> layer_sums.Sums:
        return layer_sums.merged(parts)

    folds = True  # (its merged value is a part: sums per module and rank, not per window)
