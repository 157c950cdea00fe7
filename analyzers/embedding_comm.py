"""Communication-heavy embedding: collectives issued while the embedding / output layer runs dominate."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from diag.analyzers import config, framework
from diag.analyzers.base import rule

from diag import schema
from diag.findings import Cost, Finding, Fix
from diag.metrics import positions, rank_steps, reduction, steps

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

ATTRIBUTED_STEP = schema.META_ATTRIBUTED_STEP
GRADIENT_OPS = ("reduce_scatter", "all_reduce")  # a gradient reduction: embedding data when sized as a gather
STEP_SHARE = 0.20  # embedding collectives take at least this share of the step ...
COMM_SHARE = 0.40  # ... and at least this share of all communication
EMBEDDING = re.compile(
    r"(^|\.)(wte|wpe|embed\w*|word_embeddings|position_embeddings|tok_embeddings|"
    r"lm_head|head|output_layer)(\.|$)",
    re.IGNORECASE,
)


def is_embedding(module: object) -> bool:
    return isinstance(module, str) and bool(EMBEDDING.search(module))


Tracked = tuple[tuple[int, frozenset[int]], ...]  # `attributed_steps`, hashable: (rank, its steps)


def gather_sizes(c: pd.DataFrame) -> frozenset[tuple[int, float]]:
    """(rank, bytes) of each embedding all-gather of `c` (issued while such a module runs; an
    unknown size matches none): a small set, each rank's few embedding sizes."""
    gather = _by_module(c["module"]) & (c["kind"] == "all_gather").to_numpy()
    g = pd.DataFrame({"rank": c["rank"].to_numpy()[gather], "bytes": c["bytes"].to_numpy()[gather]}).dropna()
    return frozenset((int(r), float(b)) for r, b in g.drop_duplicates().itertuples(index=False))


@dataclass(frozen=True)
class Embedding:
    """The collectives that move embedding / output-layer data, on the attributed steps (`tracked`):
    issued while such a module runs, or (ZeRO-3 buckets gradients, so the reduce-scatter carrying a
    module's gradient is issued during the next module's backward) a gradient reduction of exactly
    the size of one of that rank's embedding gathers anywhere in the trace (`gathers`, from
    `gather_sizes`: a window of steps alone may not hold the gather): partitioned parameters make
    that size specific to the module. A pick equal by value (`diag.metrics.reduction`)."""

    tracked: Tracked
    gathers: frozenset[tuple[int, float]]

    def __call__(self, c: pd.DataFrame) -> pd.Series:
        chosen = _by_module(c["module"]) | self.sized(c)
        return pd.Series(chosen, index=c.index) & _on_attributed(c, dict(self.tracked))

    def sized(self, c: pd.DataFrame) -> np.ndarray:
        """The gradient reductions of `c` of one of their rank's embedding-gather sizes."""
        grad = c["kind"].isin(GRADIENT_OPS).to_numpy()
        out = np.zeros(len(c), dtype=bool)
        sizes: dict[int, list[float]] = {}
        for r, b in self.gathers:
            sizes.setdefault(r, []).append(b)
        rank, ranks = pd.factorize(c["rank"])
        # a rank at a time, its gathers' sizes looked up whole-column (a Python test per call took
        # 0.5 s of CPU for 843,360 calls); an unknown size (NaN) matches none, as before
        for rows in positions.by_rank(rank):
            mine = sizes.get(int(ranks[rank[rows][0]]))
            if mine:
                out[rows] = grad[rows] & c["bytes"].iloc[rows].isin(mine).to_numpy()
        return out


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
    tracked = df["rank"].isin(list(steps)).to_numpy()
    return pd.Series(
        ~tracked | rank_steps.among(df, rank_steps.pairs(steps.items())), index=df.index, dtype=bool
    )


def _tracked(trace: Trace) -> Tracked:
    return tuple(sorted((r, frozenset(s)) for r, s in attributed_steps(trace).items()))


def _attributed(c: pd.DataFrame, tracked: Tracked) -> pd.DataFrame:
    """`c`'s calls on attributed steps (untracked steps' collectives carry no module: not evidence)."""
    if c.empty or "module" not in c:
        return c.iloc[:0]
    return c[_on_attributed(c, dict(tracked))]


@dataclass(frozen=True)
class Moved:
    """Bytes communicated on the attributed steps: all, by calls issued under an embedding module
    (`named`), by the other gradient reductions (`grads`: embedding data where sized as one of
    their rank's embedding gathers, `SizedBytes`), and those gathers' sizes (`Embedding.gathers`)."""

    total: float = 0.0
    named: float = 0.0
    grads: float = 0.0
    gathers: frozenset[tuple[int, float]] = frozenset()


@dataclass(frozen=True)
class MovedBytes:
    """`Moved` of the calls: what the rule checks before the per-step union, its cost."""

    tracked: Tracked

    def of(self, metrics: Metrics) -> Moved:
        c = _attributed(metrics.comms, self.tracked)
        if c.empty:
            return Moved()
        nbytes = c["bytes"].fillna(0)
        named = _by_module(c["module"])
        grad = ~named & c["kind"].isin(GRADIENT_OPS).to_numpy()
        return Moved(
            float(nbytes.sum()), float(nbytes[named].sum()), float(nbytes[grad].sum()), gather_sizes(c)
        )

    def merged(self, parts: list[Moved]) -> Moved:
        return Moved(
            sum(p.total for p in parts),
            sum(p.named for p in parts),
            sum(p.grads for p in parts),
            frozenset().union(*(p.gathers for p in parts)),
        )

    folds = True  # (its merged value is a part: sums in the windows' order, a set)


@dataclass(frozen=True)
class SizedBytes:
    """Bytes of the gradient reductions not issued under an embedding module that `pick` counts
    (sized as their rank's embedding gather): the embedding bytes beyond `Moved.named`. Its own
    reduction: the gathers of every window are known only once `MovedBytes` is merged."""

    pick: Embedding

    def of(self, metrics: Metrics) -> float:
        c = _attributed(metrics.comms, self.pick.tracked)
        if c.empty:
            return 0.0
        sized = self.pick.sized(c) & ~_by_module(c["module"])
        return float(c["bytes"].fillna(0)[sized].sum())

    def merged(self, parts: list[float]) -> float:
        return sum(parts)

    folds = True  # (its merged value is a part: a sum in the windows' order)


@dataclass
class Detail:
    """The embedding collectives' seconds per (rank, step) (the union of their intervals), modules
    (seconds, embedding-named modules), ops (calls of a known size, bytes) and ranks."""

    union: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))
    modules: dict[str, float] = field(default_factory=dict)
    ops: dict[str, tuple[int, float]] = field(default_factory=dict)
    ranks: frozenset[int] = frozenset()

    def ranked(self) -> list[str]:
        """The modules, most seconds first, ties by name (windows' sums may differ in the last bits)."""
        return sorted(self.modules, key=lambda m: (-self.modules[m], m))


@dataclass(frozen=True)
class Details:
    """`Detail` of the calls `pick` selects: one reduction, so the windowed pass reads the windows
    once for the union and what the finding names (the union is this rule's cost; the rest, a
    few groupbys of the same calls)."""

    pick: Embedding

    def of(self, metrics: Metrics) -> Detail:
        c = metrics.comms
        if c.empty or "module" not in c:
            return Detail()
        rows = c[["rank", "step", "ts", "dur", "dur_s", "kind", "bytes", "module"]][self.pick(c).to_numpy()]
        # (the selected calls' 4 columns, as `Metrics.union_per_step`: selecting within each rank's
        # rows (`union_by_step(keep=)`) copied every call's and took +25% of the rule's time)
        union = steps.union_by_step(rows[["rank", "step", "ts", "dur"]])
        named = rows[rows["module"].astype(object).map(is_embedding).astype(bool)]
        modules = named.groupby(named["module"].astype(str))["dur_s"].sum()
        ops = rows.groupby("kind", observed=True)["bytes"].agg(["count", "sum"])
        return Detail(
            union,
            {str(m): float(v) for m, v in modules.items()},
            {str(k): (int(v["count"]), v["sum"]) for k, v in ops.iterrows()},
            frozenset(int(r) for r in rows["rank"].unique()),
        )

    def merged(self, parts: list[Detail]) -> Detail:
        unions = [p.union for p in parts if len(p.union)]  # (windows' (rank, step)s are apart)
        out = Detail(
            pd.concat(unions).sort_index(kind="stable")
            if len(unions) > 1
            else (unions or [parts[0].union])[0]
        )
        for p in parts:
            for m, v in p.modules.items():
                out.modules[m] = out.modules.get(m, 0.0) + v
            for k, (n, b) in p.ops.items():
                was = out.ops.get(k, (0, 0))
                out.ops[k] = (was[0] + n, was[1] + b)
            out.ranks |= p.ranks
        return out

    folds = True  # (its merged value is a part: sums per module and op in the windows' order, a set)


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
    tracked = _tracked(trace)
    moved = metrics.reduce(MovedBytes(tracked))
    if moved.total <= 0 or (moved.named + moved.grads) / moved.total < COMM_SHARE:
        return []  # (at most the share the embedding bytes can reach)
    pick = Embedding(tracked, moved.gathers)
    comm_share = (moved.named + metrics.reduce(SizedBytes(pick))) / moved.total
    if comm_share < COMM_SHARE:  # checked before the per-step union, this rule's cost
        return []
    detail = metrics.reduce(Details(pick))
    per = steps.join_steps(metrics.steady_steps, detail.union, "comm_s")
    per = per[_on_attributed(per, dict(tracked))]
    if per.empty:
        return []
    emb_s, step_s = float(per["comm_s"].median()), float(per["dur_s"].median())
    if step_s <= 0 or emb_s / step_s < STEP_SHARE:
        return []
    modules = detail.ranked()
    cost = Cost(emb_s, step_s)
    return [
        Finding(
            severity=cost.severity,
            title=f"embedding/output-layer collectives take {cost.share:.0%} of each step",
            detail=(
                f"communication issued by {', '.join(modules[:3])} ({comm_share:.0%} of all bytes "
                f"communicated) {cost.text}."
            ),
            evidence={
                **cost.evidence(),
                "embedding_comm_s": emb_s,
                "step_s": step_s,
                "step_share": emb_s / step_s,
                "comm_share": comm_share,
                "ops": {k: {"count": n, "bytes": int(b)} for k, (n, b) in sorted(detail.ops.items())},
            },
            ranks=sorted(detail.ranks),
            layers=modules[:5],
            steps=sorted(int(s) for s in per["step"].unique())[:20],
            recoverable_s=emb_s,
            fixes=_fixes(trace, framework.job_of(metrics)),
        )
    ]


# what the rule asks first: computed in the windowed pass's first pass (`reduction.early`)
reduction.early(lambda trace: MovedBytes(_tracked(trace)))
