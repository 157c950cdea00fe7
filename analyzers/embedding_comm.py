"""Communication-heavy embedding: collectives issued while the embedding / output layer runs dominate."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from diag.analyzers import config, framework
from diag.analyzers.base import rule

from diag import schema
from diag.findings import Cost, Finding, Fix
from diag.metrics import positions

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

ATTRIBUTED_STEP = schema.META_ATTRIBUTED_STEP
STEP_SHARE = 0.20  # embedding collectives take at least this share of the step ...
COMM_SHARE = 0.40  # ... and at least this share of all communication
EMBEDDING = re.compile(
    r"(^|\.)(wte|wpe|embed\w*|word_embeddings|position_embeddings|tok_embeddings|"
    r"lm_head|head|output_layer)(\.|$)",
    re.IGNORECASE,
)


def is_embedding(module: object) -> bool:
    return isinstance(module, str) and bool(EMBEDDING.search(module))


def embedding_mask(c: pd.DataFrame) -> pd.Series:
    """Collectives that move embedding / output-layer data: issued while such a module runs, or (ZeRO-3
    buckets gradients, so the reduce-scatter carrying a module's gradient is issued during the next
    module's backward) a gradient reduction of exactly the size of one of that rank's embedding
    gathers: partitioned parameters make that size specific to the module."""
    by_module = _by_module(c["module"])
    gather = by_module & (c["kind"] == "all_gather").to_numpy()
    grad = c["kind"].isin(("reduce_scatter", "all_reduce")).to_numpy()
    sized = np.zeros(len(c), dtype=bool)
    nbytes = c["bytes"]
    # a rank at a time, its gathers' sizes looked up whole-column (a Python test per call took
    # 0.5 s of CPU for 843,360 calls); an unknown size (NaN) matches none, as before
    for rows in positions.by_rank(pd.factorize(c["rank"])[0]):
        mine = nbytes.iloc[rows]
        sizes = mine[gather[rows]]
        if len(sizes):
            sized[rows] = grad[rows] & mine.isin(sizes[sizes.notna()]).to_numpy()
    return pd.Series(by_module | sized, index=c.index)


def _by_module(module: pd.Series) -> np.ndarray:
    """`is_embedding` of each call's module: once per category of a categorical."""
    if isinstance(module.dtype, pd.CategoricalDtype):
        hit = np.array([is_embedding(m) for m in module.cat.categories] + [False], dtype=bool)
        return hit[module.cat.codes.to_numpy()]  # code -1 (missing): the last, False
    return module.astype(object).map(is_embedding).astype(bool).to_numpy()


def attributed_steps(trace: Trace) -> dict[int, set[int]]:
    """{rank: steps whose collectives carry module attribution} for ranks whose agent attributes only
    some steps (header/meta `attribute_every`, one `attributed_step` meta per such step); ranks not
    listed attributed every step (traces from before the option, imported traces)."""
    ranks = [r for r, h in trace.headers.items() if h.get(schema.META_ATTRIBUTE_EVERY) is not None]
    if not ranks:
        return {}
    meta = trace.frame("meta")
    rows = meta[meta["key"].astype(object) == ATTRIBUTED_STEP]
    out: dict[int, set[int]] = {r: set() for r in ranks}
    for r, step in zip(rows["rank"], rows["value"]):
        if r in out:
            out[r].add(int(step))
    return out


def _on_attributed(df: pd.DataFrame, steps: dict[int, set[int]]) -> pd.Series:
    """Rows of `df` (rank, step columns) on steps where module attribution was on."""
    if not steps:
        return pd.Series(True, index=df.index)
    return pd.Series(
        [r not in steps or s in steps[r] for r, s in zip(df["rank"], df["step"])], index=df.index, dtype=bool
    )


def _fixes(trace: Trace, job: framework.Job) -> list[Fix]:
    """hpZ sized to the ranks per node (none on one node: the gather never leaves it), sparse
    embedding gradients, Megatron's untied embeddings; only what changes the job's setting."""
    fixes = []
    stage = config.zero_stage(trace)
    if job.deepspeed is not False:
        lead = "" if job.deepspeed else "if the job uses DeepSpeed ZeRO: "
        zero: dict[str, object] = {}
        hosts = trace.hosts()
        per_node = max(sum(1 for h in hosts.values() if h == v) for v in set(hosts.values())) if hosts else 0
        if stage == 3:
            if (
                len(set(hosts.values()) - {"?"}) > 1
                and per_node > 1
                and int(job.zero.get("zero_hpz_partition_size") or 1) != per_node
            ):
                zero["zero_hpz_partition_size"] = per_node
            if not job.zero.get("zero_quantized_weights"):
                zero["zero_quantized_weights"] = True
            if zero:
                fixes.append(
                    Fix(
                        f"{lead}ZeRO-3 gathers the whole vocab x hidden matrix every forward and "
                        "backward: " + ", ".join(f"{k} {v}" for k, v in zero.items()),
                        ds_config={"zero_optimization": zero},
                    )
                )
        elif not job.megatron:
            # no config key: DeepSpeed (0.19) rejects the old `sparse_gradients` flag and reduces the
            # gradients of an nn.Embedding(sparse=True) sparsely by itself
            fixes.append(
                Fix(
                    f"{lead}all-reduce only the embedding rows a batch touched: construct the "
                    "embedding with nn.Embedding(..., sparse=True)"
                )
            )
    if (
        job.megatron
        and int(trace.layout().get("pp") or 1) > 1
        and not job.arg("untie_embeddings_and_output_weights")
    ):
        args = job.flags("--untie-embeddings-and-output-weights")
        if args:
            fixes.append(
                Fix(
                    "untie input/output embeddings so the first and last pipeline stages stop "
                    "all-reducing the tied weight",
                    megatron_args=args,
                )
            )
    return fixes


@rule("embedding_comm")
def embedding_comm(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when collectives moving embedding/output-layer data (see `embedding_mask`) cover >= 20%
    of the median step (union of their intervals) and carry >= 40% of all bytes communicated.
    Fix (only what changes the job's setting): ZeRO-3 -> zero_hpz_partition_size = ranks per node when
    the job spans nodes, quantized weights; else sparse embedding gradients (nn.Embedding(sparse=True));
    Megatron with pp > 1: untied embeddings. recoverable_s: an upper bound, the embedding's median
    communication time per step. Shares are computed over the steps where the agent attributed modules
    (`attributed_steps`; every step of older or imported traces). Under ZeRO-3 prefetch
    (stage3_prefetch_bucket_size > 0) gathers are issued ahead by an earlier module and cannot be
    attributed: the rule then stays silent. Severity: the embedding communication's share of the step."""
    c = metrics.comms
    if c.empty or "module" not in c:
        return []
    tracked = attributed_steps(trace)
    c = c[_on_attributed(c, tracked)]  # untracked steps' collectives carry no module: not evidence
    if c.empty:
        return []
    emb = embedding_mask(c)
    total_bytes = float(c["bytes"].fillna(0).sum())
    if total_bytes <= 0:
        return []
    comm_share = float(c.loc[emb, "bytes"].fillna(0).sum()) / total_bytes
    if comm_share < COMM_SHARE:  # checked before the per-step union, this rule's cost
        return []
    per = metrics.union_per_step(emb)
    per = per[_on_attributed(per, tracked)]
    if per.empty:
        return []
    emb_s, step_s = float(per["comm_s"].median()), float(per["dur_s"].median())
    if step_s <= 0 or emb_s / step_s < STEP_SHARE:
        return []
    rows = c[emb]
    named = rows[rows["module"].astype(object).map(is_embedding).astype(bool)]
    modules = named.groupby(named["module"].astype(str))["dur_s"].sum()
    modules = modules.sort_values(ascending=False, kind="stable")
    ops = rows.groupby("kind")["bytes"].agg(["count", "sum"])
    cost = Cost(emb_s, step_s)
    return [
        Finding(
            severity=cost.severity,
            title=f"embedding/output-layer collectives take {cost.share:.0%} of each step",
            detail=(
                f"communication issued by {', '.join(modules.index[:3])} ({comm_share:.0%} of all bytes "
                f"communicated) {cost.text}."
            ),
            evidence={
                **cost.evidence(),
                "embedding_comm_s": emb_s,
                "step_s": step_s,
                "step_share": emb_s / step_s,
                "comm_share": comm_share,
                "ops": {k: {"count": int(v["count"]), "bytes": int(v["sum"])} for k, v in ops.iterrows()},
            },
            ranks=sorted(int(r) for r in rows["rank"].unique()),
            layers=list(modules.index[:5]),
            steps=sorted(int(s) for s in per["step"].unique())[:20],
            recoverable_s=emb_s,
            fixes=_fixes(trace, framework.job_of(metrics)),
        )
    ]
