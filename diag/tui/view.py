"""View state: plain rows computed from a `JobModel`, what each panel shows (numbers, not text).

Definitions (the tests recompute them from `diag.load` of the same trace):
- job step time: the slowest rank's duration of a step; sparkline = the last `SPARK` steps.
- rank comm share: communication wall time / step time of that rank's last step.
- collectives: per (process group, op): calls and bytes per rank (every member rank records each
  collective of its group: the members' records summed, over the number of ranks that recorded
  them, as `diag analyze` counts per rank), mean latency, busbw (`schema.bus_bandwidth`: bus bytes
  over total time, as `diag analyze` reports it).
- layers: time and FLOPs per sampled (rank, step), leaves of the module tree, top `TOP_LAYERS`
  by time, plus the embedding / output layers always.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from diag import schema
from diag.tui.model import JobModel
from diag.tui.state import RankState

SPARK = 60
MEAN_OVER = 20
STALE_S = 10.0
STRAGGLER = 1.2  # a rank whose last step is this much slower than the median is flagged
TOP_LAYERS = 15
PINNED = ("embed", "wte", "head", "output_layer", "word_embeddings")


@dataclass
class RankRow:
    rank: int
    host: str
    step: int | None
    step_ms: float | None
    mean_ms: float | None
    comm_share: float | None
    mem_peak: int | None
    mem_capacity: int | None
    last_comm: str
    health: str


@dataclass
class LayerRow:
    module: str
    ms_per_step: float
    fwd_ms: float
    bwd_ms: float
    gflops_per_step: float
    tflops_s: float | None
    pinned: bool


@dataclass
class JobView:
    ranks: int = 0
    hosts: int = 0
    layout: dict[str, Any] = field(default_factory=dict)
    step_series: list[float] = field(default_factory=list)
    last_step: int | None = None
    last_ms: float | None = None
    mean_ms: float | None = None
    samples_per_s: float | None = None
    loss_scale: float | None = None
    skipped_steps: int = 0
    events: int = 0
    rank_rows: list[RankRow] = field(default_factory=list)
    comm_rows: list[Any] = field(default_factory=list)  # CommStat, sorted by total time
    layer_rows: list[LayerRow] = field(default_factory=list)
    overflow_rows: list[dict[str, Any]] = field(default_factory=list)
    overflow_steps: int = 0  # steps on which any rank overflowed, since the start
    state: str = "live"  # of a followed job: live / ended / detached
    gpu_rows: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # "rank-00001.jsonl: a FIFO, ...: refused"
    version: int = -1  # the model's version it was built from (`Pump.caught_up`)


def build_view(m: JobModel) -> JobView:
    v = JobView(
        ranks=len(m.headers),
        hosts=len({h.get("host") for h in m.headers.values()}),
        layout=_layout(m),
        loss_scale=m.loss_scale,
        skipped_steps=m.skipped_steps,
        events=m.events,
        version=m.version,
    )
    steps = sorted(m.step_max)
    v.step_series = [m.step_max[s] / 1e6 for s in steps[-SPARK:]]
    if steps:
        v.last_step, v.last_ms = steps[-1], m.step_max[steps[-1]] / 1e6
        recent = v.step_series[-MEAN_OVER:]
        v.mean_ms = sum(recent) / len(recent)
        v.samples_per_s = _samples_per_s(m, steps[-MEAN_OVER:])
    v.rank_rows = rank_rows(m)
    v.comm_rows = sorted(m.comms.values(), key=lambda c: (-c.dur, c.group, c.op))
    v.layer_rows = layer_rows(m)
    v.overflow_rows = overflow_rows(m)
    v.overflow_steps = len(m.overflow_steps)
    v.state = m.state
    v.gpu_rows = [m.gpus[k] for k in sorted(m.gpus)]
    v.refused = [f"{os.path.basename(path)}: {why}" for path, why in sorted(m.refused.items())]
    return v


def _layout(m: JobModel) -> dict[str, Any]:
    """The job's layout as the lowest rank that knows states it, and `roles`: each named process
    group role (tp, pp, dp, cp, ep, ...; not the default `world`) and its size, from every rank's
    `groups` record."""
    keys = [k for k in schema.LAYOUT_KEYS if k not in ("grad_accum", "model")]  # the header's one line
    out: dict[str, Any] = {}
    roles: dict[str, int] = {}
    for rank in sorted(m.headers):
        for k in keys:
            if k not in out and m.headers[rank].get(k) is not None:
                out[k] = m.headers[rank][k]
        groups = m.headers[rank].get("groups")
        for g in groups.values() if isinstance(groups, dict) else ():
            if isinstance(g, dict) and isinstance(g.get("role"), str) and g["role"] != "world":
                roles.setdefault(g["role"], g.get("size"))
    if roles:
        out["roles"] = roles
    return out


def _samples_per_s(m: JobModel, steps: list[int]) -> float | None:
    """The job's samples/s: a step's samples (DeepSpeed's `global_samples` delta: the global batch,
    the same on every rank; mean over the ranks reporting) over the job's step time (the slowest
    rank's), as `diag analyze` gives the job's rate. It was multiplied by dp again: twice the rate."""
    per_step = [statistics.fmean(m.step_samples[s]) for s in steps if m.step_samples.get(s)]
    secs = sum(m.step_max[s] for s in steps if m.step_samples.get(s)) / 1e9
    if not per_step or secs <= 0:
        return None
    return sum(per_step) / secs


def rank_rows(m: JobModel) -> list[RankRow]:
    lasts = [st.last_step[1] for st in m.ranks.values() if st.last_step]
    median = statistics.median(lasts) if lasts else 0
    rows = []
    for rank in sorted(m.ranks):
        st = m.ranks[rank]
        last = st.last_step
        recent = [d for _, d in list(st.steps)[-MEAN_OVER:]]
        lc = st.last_comm
        rows.append(
            RankRow(
                rank,
                st.host,
                last[0] if last else None,
                last[1] / 1e6 if last else None,
                sum(recent) / len(recent) / 1e6 if recent else None,
                st.comm_share(),
                st.mem_peak,
                st.mem_capacity,
                f"{lc[0]} [{lc[1]}]" if lc else "",
                health(m, st, median),
            )
        )
    return rows


def health(m: JobModel, st: RankState, median: float) -> str:
    """ "ok", or the problems of a rank: stale, straggler (the straggler rule's verdict, as the
    Findings tab shows it; or its last step this much slower than the median), overflows, dropped
    events, errors."""
    out = [] if m.state == "live" else [m.state]  # the job ended or the agent detached
    if st.rank in m.stragglers:
        out.append("straggler")
    if m.newest_ts and st.last_ts and (m.newest_ts - st.last_ts) / 1e9 > STALE_S:
        out.append(f"stale {(m.newest_ts - st.last_ts) / 1e9:.0f}s")
    last = st.last_step
    if last and median and last[1] > STRAGGLER * median:
        out.append(f"slow x{last[1] / median:.1f}")
    for n, what in ((st.overflows, "overflow"), (st.dropped, "dropped"), (st.errors, "errors")):
        if n:
            out.append(f"{what} {n}")
    return ", ".join(out) or "ok"


def layer_rows(m: JobModel) -> list[LayerRow]:
    """The `TOP_LAYERS` leaf layers by time, plus the pinned (embedding / output) ones."""
    rows = leaf_layer_rows(m)
    top = rows[:TOP_LAYERS]
    return top + [r for r in rows[TOP_LAYERS:] if r.pinned]


def leaf_layer_rows(m: JobModel) -> list[LayerRow]:
    """Every leaf layer of the module tree (a model's FLOPs are the sum of its leaves'), by time, over
    the steady samples as `diag analyze`'s top layers are (`layer_stats.steady_samples`): the warm-up
    step's only until a later step is sampled (Megatron-LM's simple train loop: rank 0's embedding
    forward read 115.7 ms on the warm-up step, 111.6 of them waiting in its first all_reduce)."""
    layers, rank_steps = (m.layers, m.layer_rank_steps) if m.layers else (m.warm_layers, m.warm_rank_steps)
    names = sorted(layers)
    leaves = [
        n
        for i, n in enumerate(names)
        if not (i + 1 < len(names) and names[i + 1].startswith(n + ".")) and not _is_root(n)
    ]
    n_steps = max(1, len(rank_steps))
    rows = []
    for name in leaves:
        s = layers[name]
        total = s.fwd + s.bwd
        rows.append(
            LayerRow(
                name,
                total / n_steps / 1e6,
                s.fwd / n_steps / 1e6,
                s.bwd / n_steps / 1e6,
                s.flops / n_steps / 1e9,
                s.flops / total / 1e3 if total else None,
                any(p in name.lower() for p in PINNED),
            )
        )
    rows.sort(key=lambda r: (-r.ms_per_step, r.module))
    return rows


def _is_root(name: str) -> bool:
    """The collector names a model's root by its class (`DeepSpeedEngine`, `GPTModel`): a dotless
    CamelCase name is a whole model, not a layer."""
    return "." not in name and name[:1].isupper()


def overflow_rows(m: JobModel) -> list[dict[str, Any]]:
    """Loss-scale events grouped by step, newest first: which ranks overflowed, scale before/after;
    the recent events, and every step that overflowed even when its events are no longer recent."""
    by_step: dict[int, dict[str, Any]] = {}
    for ev in m.overflow:
        step = int(ev.get("step") or 0)
        row = by_step.setdefault(
            step,
            {
                "step": step,
                "ranks": [],
                "scale_before": None,
                "scale_after": None,
                "source": ev.get("source"),
            },
        )
        if ev.get("overflow"):
            row["ranks"].append(ev["rank"])
        row["scale_before"] = row["scale_before"] or ev.get("scale_before")
        row["scale_after"] = ev.get("scale_after", row["scale_after"])
    for step, kept in m.overflow_steps.items():
        if step not in by_step:
            by_step[step] = {**kept, "ranks": list(kept["ranks"])}
    return [by_step[s] for s in sorted(by_step, reverse=True)]
