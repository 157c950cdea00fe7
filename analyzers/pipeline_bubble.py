"""Pipeline bubble above the schedule's (p-1)/m: stages idle waiting for activations or gradients.

The micro-batch count m is measured from the pipeline's own sends: in every non-interleaved schedule
(GPipe, 1F1B; DeepSpeed's PipelineEngine, Megatron's) a first or last stage sends exactly one tensor
per micro-batch per step (activations forward, or gradients back), a middle stage two. Only the
step's largest messages count: DeepSpeed's engine under Megatron-DeepSpeed sends a 72-byte shape
message before every activation and gradient (measured on its pretrain_gpt.py at TP=2 x PP=2). The
fewest steady sends per step over the ranks is therefore m, whatever the configuration says. The recorded
setting (num_microbatches, gradient_accumulation_steps, ...) is used only where sends are not
recorded one by one (NCCL SendRecv kernels of a GPU trace) or the schedule is interleaved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
from diag.analyzers import config, evidence, framework
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix
from diag.metrics import steps
from diag.metrics.sched import runq_per_step
from diag.ranks import rank_name
from diag.vocab import P2P

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

TOLERANCE = 0.05  # measured bubble may exceed (p-1)/m by this much (timing noise)
MIN_BUBBLE = 0.10  # and must be at least this large to matter
SCHEDULE_LIMIT = 0.25  # (p-1)/m itself above this: too few microbatches (the fix's own target, 4(p-1))
QUIET = 1.25  # a step within this factor of the quickest steady step was not slowed by outside load
STARVED = 0.5  # a rank waiting for a CPU this share of its steps: the waits are the host's
IMBALANCE = 1.1  # a stage computing this many times another's time a step: the split is unbalanced


def microbatches(trace: Trace) -> int | None:
    """Microbatches per step as configured (agent, ds_config, log's grad_accum or global / (micro x dp))."""
    for key in ("num_microbatches", "gradient_accumulation_steps", "grad_accum"):
        for h in trace.headers.values():
            if h.get(key):
                return int(h[key])
    got = config.ds_config(trace).get("gradient_accumulation_steps")
    if got:
        return int(got)
    lay = trace.layout()
    gb, mb, dp = lay.get("global_batch"), lay.get("micro_batch"), lay.get("dp")
    if gb and mb and dp and gb % (mb * dp) == 0:
        return int(gb // (mb * dp))
    return None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


Split = tuple[tuple[Any, float], tuple[Any, float]]  # (heavier rank, compute s), (lighter rank, compute s)


def _fixes(trace: Trace, job: framework.Job, p: int, m: int, split: Split | None) -> list[Fix]:
    """More microbatches, interleaved stages, balanced stages (`split`: the heavier and the lighter
    stage's rank and compute seconds, where the split is unbalanced): each only when it changes the
    job's setting and its framework has the knob (Megatron-DeepSpeed runs DeepSpeed's pipeline engine:
    no interleaving, no per-stage layer counts; its microbatches are gradient_accumulation_steps)."""
    fixes = []
    target = 4 * (p - 1)
    layers = _int(job.arg("num_layers"))
    if m < target:
        if job.framework == framework.MEGATRON_LM:
            micro, dp = _int(job.arg("micro_batch_size")), _int(trace.layout().get("dp"))
            if micro and dp and job.flags("--global-batch-size", "1"):
                fixes.append(
                    Fix(
                        f"raise microbatches per step from {m} to {target} (bubble (p-1)/m <= 0.25)",
                        megatron_args=job.flags("--global-batch-size", str(target * micro * dp)),
                    )
                )
            elif not job.args:  # megatron-core's own schedule in the job's loop: no Megatron-LM arguments
                fixes.append(
                    Fix(
                        f"pass num_microbatches={target} (not {m}) to megatron-core's forward_backward_func "
                        f"(get_forward_backward_func()), micro_batch_size divided by {target / m:g} to keep "
                        f"the batch: {_bubble_change(p, m, target)}"
                    )
                )
        elif deepspeed_pipeline(trace):
            fixes.append(_more_microbatches(trace, job, p, m, target))
        elif job.deepspeed is not False:
            lead = "" if job.deepspeed else "if the job uses DeepSpeed: "
            fixes.append(
                Fix(
                    f"{lead}raise microbatches per step from {m} to {target} (bubble (p-1)/m "
                    "<= 0.25; keep the global batch by lowering train_micro_batch_size_per_gpu)",
                    ds_config={"gradient_accumulation_steps": target},
                )
            )
    # Megatron-DeepSpeed's GPTModelPipe hard-codes partition_method='type:transformer' (no argument):
    # the balancing fix is for a PipelineModule the user builds, and only where the stages' compute
    # differs (a schedule-bound bubble is the fill and drain: balancing does not shrink it). DeepSpeed
    # keeps no record of the method a PipelineModule was split by: the knob is named, not a value
    if split is not None and deepspeed_pipeline(trace) and job.framework != framework.MEGATRON_DEEPSPEED:
        (heavy, heavy_s), (light, light_s) = split
        fixes.append(
            Fix(
                f"balance the stages: move layers from {rank_name(heavy)}'s stage ({heavy_s * 1e3:.0f} ms "
                f"of compute a step) to {rank_name(light)}'s ({light_s * 1e3:.0f} ms); PipelineModule's "
                "partition_method (or the order of its layers) decides the split"
            )
        )
    interleaved = job.arg("num_layers_per_virtual_pipeline_stage")
    if job.framework == framework.MEGATRON_LM and layers and not interleaved:
        per_stage = layers // p
        if per_stage >= 2 and layers % p == 0 and job.flags("--num-layers-per-virtual-pipeline-stage", "1"):
            v = per_stage // 2 if per_stage % 2 == 0 else 1
            fixes.append(
                Fix(
                    f"interleave virtual stages: {per_stage} layers per stage in chunks of {v}",
                    megatron_args=job.flags("--num-layers-per-virtual-pipeline-stage", str(v)),
                )
            )
    if job.framework == framework.MEGATRON_LM and layers and p > 2 and layers % p == 0:
        per_stage = layers // p
        rest = layers - 2 * (per_stage - 1)
        if per_stage >= 2 and rest % (p - 2) == 0:
            args = (
                "--decoder-first-pipeline-num-layers",
                str(per_stage - 1),
                "--decoder-last-pipeline-num-layers",
                str(per_stage - 1),
            )
            if job.flags(*args):
                fixes.append(
                    Fix(
                        "balance stages: the first and last also hold the embedding and the loss",
                        megatron_args=job.flags(*args),
                    )
                )
    return fixes


def deepspeed_pipeline(trace: Trace) -> bool:
    """DeepSpeed's PipelineEngine runs the stages (also under Megatron-DeepSpeed): no interleaved
    schedule, no per-stage layer-count flags; its knobs are the micro-batch count and PipelineModule's
    partition_method."""
    return any(h.get("pipeline_engine") == "deepspeed" for h in trace.headers.values())


def _bubble_change(p: int, m: int, target: int) -> str:
    """The schedule's bubble share before and after m -> target micro-batches, as a fix says it."""
    return f"(p-1)/(m+p-1) {(p - 1) / (m + p - 1):.2f} -> {(p - 1) / (target + p - 1):.2f}"


def _more_microbatches(trace: Trace, job: framework.Job, p: int, m: int, target: int) -> Fix:
    """m -> target micro-batches; the global batch (micro x m x dp) stays where the micro-batch divides,
    else train_batch_size grows with them (DeepSpeed checks train_batch_size = micro x accumulation x dp)."""
    cfg = config.ds_config(trace)
    micro, batch = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("train_batch_size")
    patch: dict[str, Any] = {"gradient_accumulation_steps": target}
    args: list[str] = []
    what = _bubble_change(p, m, target)
    if micro and int(micro) * m % target == 0:
        patch["train_micro_batch_size_per_gpu"] = int(micro) * m // target
        args = job.flags("--micro-batch-size", str(patch["train_micro_batch_size_per_gpu"]))
        what += ", same global batch"
    elif batch:
        patch["train_batch_size"] = int(batch) // m * target
        what += f", global batch {batch} -> {patch['train_batch_size']}"
    return Fix(
        f"raise the pipeline's micro-batches per step from {m} to {target} ({what})",
        ds_config=patch,
        megatron_args=args,
    )


def sends_per_step(metrics: Metrics) -> pd.Series:
    """rank -> tensors sent per steady step: the sends of the step's largest message size (shape
    messages left out), for the ranks whose count is the same on every steady step; the warm-up
    step is left out (DeepSpeed's PipelineEngine also sends tensor shapes on its first step)."""
    steady = metrics.steady_steps
    if not metrics.calls or steady.empty:
        return pd.Series(dtype="int64")
    keys = steady.set_index(["rank", "step"]).index
    counts = metrics.per_step(_sends_at_largest).reindex(keys, fill_value=0)
    by_rank = counts.groupby(level="rank")
    steady_ranks = by_rank.nunique() == 1  # a rank whose sends vary step to step gives no count
    return by_rank.first()[steady_ranks].astype("int64")


def _sends_at_largest(c: pd.DataFrame) -> pd.Series:
    """(rank, step) -> its sends of the step's largest message size."""
    sends = c[c["op"] == "send"]
    largest = sends.groupby(["rank", "step"], observed=True)["bytes"].transform("max")
    return sends[sends["bytes"] == largest].groupby(["rank", "step"], observed=True).size()


def _p2p_union(c: pd.DataFrame) -> pd.Series:
    """(rank, step) -> seconds covered by its send/recv calls (their union)."""
    return steps.union_by_step(c, keep=c["kind"].isin(P2P).to_numpy())


def measured_microbatches(metrics: Metrics) -> int | None:
    """m from the sends: the fewest sends per steady step over the ranks (an end stage sends one
    message per micro-batch). None unless every rank sends the same number on each steady step: in
    a training pipeline every stage sends (activations on, gradients back), so a rank without sends
    or with a varying count means the sends were not all recorded."""
    per = sends_per_step(metrics)
    ranks = metrics.steady_steps["rank"].unique()
    if per.empty or len(per) < len(ranks) or int(per.min()) == 0:
        return None
    return int(per.min())


@dataclass(frozen=True)
class Bubble:
    """What the rule measured on one trace: the schedule (p, m and where m came from) and the time
    stages spent blocked in send/recv, as a share of compute and of the step."""

    p: int
    m: int
    m_source: str  # "sends": counted from the pipeline's sends; "config": the recorded setting
    m_config: int | None
    sends_by_rank: pd.Series  # rank -> sends per steady step
    by_rank: pd.Series  # rank -> median of p2p time / rest of the step (Megatron's definition)
    fraction_by_rank: pd.Series  # rank -> median of p2p time / step
    step_s: float
    steps: tuple[int, int]  # (steps measured, steady steps): see `quiet_steps`
    runq_by_rank: pd.Series  # rank -> median seconds a measured step waited for a CPU (empty: not sampled)

    @property
    def ideal(self) -> float:
        """The schedule's bubble over compute, (p-1)/m."""
        return (self.p - 1) / self.m

    @property
    def ideal_fraction(self) -> float:
        """The schedule's bubble as a share of the step, (p-1)/(m+p-1)."""
        return (self.p - 1) / (self.m + self.p - 1)

    @property
    def compute_by_rank(self) -> pd.Series:
        """rank -> seconds of a step not blocked in send/recv (the stage's own work)."""
        return self.step_s * (1 - self.fraction_by_rank)


def _interleaved(metrics: Metrics) -> bool:
    """Virtual stages send once per chunk boundary: the sends then count m times a factor."""
    job = framework.job_of(metrics)
    return bool(
        job.arg("num_layers_per_virtual_pipeline_stage")
        or (_int(job.arg("virtual_pipeline_model_parallel_size")) or 1) > 1
        or (_int(job.arg("num_virtual_stages_per_pipeline_rank")) or 1) > 1
    )


def measure(trace: Trace, metrics: Metrics) -> Bubble | None:
    """The bubble of a pipeline-parallel trace, None when pp <= 1, m is unknown or no p2p time was
    recorded."""
    p = int(trace.layout().get("pp") or 1)
    if p <= 1:
        return None
    configured = microbatches(trace)
    counted = None if _interleaved(metrics) else measured_microbatches(metrics)
    m, source = (counted, "sends") if counted else (configured, "config")
    if not m:  # the schedule's bubble (p-1)/m is the premise: unknown m, no verdict
        return None
    if not metrics.calls:
        return None
    per = steps.join_steps(metrics.steady_steps, metrics.per_step(_p2p_union), "comm_s")
    if per.empty:
        return None
    steady = int(per["step"].nunique())
    per = quiet_steps(per)
    runq = _runq_at(trace, metrics, per)
    if starved(per, runq):
        return None
    per["bubble"] = per["comm_s"] / (per["dur_s"] - per["comm_s"]).clip(lower=1e-9)
    per["fraction"] = per["comm_s"] / per["dur_s"].clip(lower=1e-9)
    return Bubble(
        p=p,
        m=int(m),
        m_source=source,
        m_config=configured,
        sends_by_rank=sends_per_step(metrics),
        by_rank=per.groupby("rank")["bubble"].median(),
        fraction_by_rank=per.groupby("rank")["fraction"].median(),
        step_s=float(per["dur_s"].median()),
        steps=(int(per["step"].nunique()), steady),
        runq_by_rank=pd.Series(dtype=float) if runq is None else _median_by_rank(runq, per),
    )


def _median_by_rank(values: Any, per: pd.DataFrame) -> pd.Series:
    """rank -> the median of `values`, one a row of `per`."""
    return pd.Series(values).groupby(per["rank"].to_numpy()).median()


def _runq_at(trace: Trace, metrics: Metrics, per: pd.DataFrame) -> Any:
    """Seconds each row of `per` (rank, step) waited for a CPU (the agent's `sched` samples; NaN
    where a step has none), or None where none was sampled."""
    runq = runq_per_step(trace.sched, metrics.steps)
    if runq.empty:
        return None
    return runq.reindex(pd.MultiIndex.from_frame(per[["rank", "step"]])).to_numpy()


def starved(per: pd.DataFrame, runq: Any) -> bool:
    """Some rank waited for a CPU (run-queue wait, the agent's `sched` samples) >= STARVED of its
    measured steps' time (median): its host is oversubscribed, and the other stages' waits for it
    are the host's, not the schedule's or the split's. Megatron-LM's run_simple_mcore_train_loop.py
    at PP=2, m=4 under load 11.6 on 2 cores (tests/fixtures/pp2_starved): stage 1 was off-CPU 130-233
    ms of every 215-365 ms step, stage 0 waited 2.8x its compute, and the rule said CRITICAL
    "pipeline bubble 2.82"."""
    if runq is None:
        return False
    return bool((_median_by_rank(runq / per["dur_s"].clip(lower=1e-9).to_numpy(), per) >= STARVED).any())


def host_made(got: Bubble) -> bool:
    """The waiting rank's wait past the schedule's (p-1)/m, in seconds a step, is no more than
    another rank's wait for a CPU a step (median, `runq_by_rank`): the stage it waits for may have
    been off-CPU that long, so neither the schedule nor the split is shown to make it.
    DeepSpeedExamples' pipeline_parallelism AlexNet (PP=2, m=4) on a 2-core host at load 4
    (tests/fixtures/pp2_alexnet_contended): rank 1 waited 0.39 of its compute at the schedule's 0.25
    (0.15 s a step past it) while rank 0 waited 0.44 s a step for a CPU; the rule said CRITICAL
    "pipeline bubble 0.39" in 1 of 4 identical runs (0.12-0.22 in the others)."""
    waiting = got.by_rank.idxmax()
    others = got.runq_by_rank.drop(waiting, errors="ignore").dropna()
    if others.empty:
        return False
    past = (float(got.by_rank[waiting]) - got.ideal) * float(got.compute_by_rank[waiting])
    return past <= float(others.max())


def quiet_steps(per: pd.DataFrame) -> pd.DataFrame:
    """The rows of the steady steps whose slowest rank took at most QUIET x the quickest such step.
    Outside load (CPU contention, a data-loader stall, another job) only lengthens a step, and a
    stage it slows makes the other stages wait in send/recv, a wait neither the schedule nor the
    split made; their bubble is in every step, the quickest included. Megatron-LM's
    run_simple_mcore_train_loop.py at PP=2, m=4 on a loaded 2-core machine
    (tests/fixtures/pp2_noisy_steps): in 6 of 10 steady steps (76-110 ms against 59-63) stage 1
    waited on a slowed stage 0, and the median over every step named stage 1 (0.83 of its compute)
    where stage 0 waits (0.92 over the 3 quiet steps, stage 1 0.19: it holds the output layer and
    the loss, 13.7 against 10.0 MFLOP a step). The faster half of the steps is not enough: noise in
    most steps puts the median among them."""
    slowest = per.groupby("step")["dur_s"].max()
    return per[per["step"].isin(slowest.index[slowest <= QUIET * slowest.min()])].copy()


def unbalanced(got: Bubble) -> Split | None:
    """((heavier rank, its compute s), (lighter rank, its compute s)) where the split, not the
    schedule, makes the bubble: one stage waits no more than the schedule's (p-1)/m (it sets the
    pace), another waits past it by >= MIN_BUBBLE, and the pacing stage computes >= IMBALANCE x the
    waiting one's time a step (compute: the step less its send/recv). Equal stages whose waits differ
    by noise give None. DeepSpeedExamples' AlexNet split by parameters: every convolution on stage 0,
    stage 1 waiting 0.50 of its compute where the schedule leaves 0.125. None too where an even split
    at the schedule's bubble would take no less than the step does (mean compute x (1 + (p-1)/m)): the
    split then costs nothing (Megatron-LM's run_simple_mcore_train_loop.py at PP=2, m=1 on CPU was
    called unbalanced with "the imbalance costs 0 us of every 48.7 ms step")."""
    by = got.by_rank
    light, heavy = by.idxmax(), by.idxmin()
    if not (by[heavy] <= got.ideal + TOLERANCE < by[light] and by[light] - by[heavy] >= MIN_BUBBLE):
        return None
    compute = got.compute_by_rank
    if compute[heavy] < IMBALANCE * compute[light] or even_split_saves(got) <= 0:
        return None
    return (heavy, float(compute[heavy])), (light, float(compute[light]))


def _over(got: Bubble) -> str:
    """Which steps the waits are medians over, as the detail says it."""
    n, steady = got.steps
    return (
        f"Medians over the {n} of {steady} steady steps within {QUIET:g}x the quickest (outside load "
        "only lengthens a step)."
    )


def even_split_saves(got: Bubble) -> float:
    """Seconds a step would save with the stages' compute split evenly at the schedule's bubble:
    the step less the stages' mean compute x (1 + (p-1)/m), at least 0."""
    return max(got.step_s - float(got.compute_by_rank.mean()) * (1 + got.ideal), 0.0)


@rule("pipeline_bubble")
def pipeline_bubble(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires for pp > 1 when the measured bubble (time blocked in pipeline send/recv over the rest of
    the step, Megatron's definition) exceeds (p-1)/m + 0.05 and is >= 0.10, or when the schedule's own
    (p-1)/m > 0.25 with a measured bubble >= 0.10. m is counted from the pipeline's sends per step
    (the configured value where sends are not recorded one by one). Fix, where it changes the job's
    setting and its framework has the knob: microbatches up to 4(p-1) (DeepSpeed
    gradient_accumulation_steps, Megatron-LM --global-batch-size, a megatron-core loop without
    Megatron-LM arguments: num_microbatches of forward_backward_func); Megatron-LM only:
    --num-layers-per-virtual-pipeline-stage when a stage holds >= 2 layers,
    --decoder-first/last-pipeline-num-layers. recoverable_s: the bubble above (p-1)/max(m, 4(p-1))
    (what 4(p-1) microbatches leave) times compute.
    The waits are each rank's medians over the steady steps whose slowest rank took at most 1.25x the
    quickest (`quiet_steps`: outside load only lengthens a step, and a stage it slows makes the others
    wait); their send/recv time is the union of the calls' intervals (megatron-core's 1F1B sends and
    receives at once). Silent when m is neither counted nor recorded, or when some rank waited for a CPU
    >= 50% of its steps (`starved`: the host is oversubscribed), or, where the schedule's own (p-1)/m
    is no more than 0.25, when the waiting rank's wait past it (seconds a step) is no more than another
    rank's median wait for a CPU a step (`host_made`). Severity: the bubble's share of the step
    (send/recv waits over the step). An unbalanced split (`unbalanced`: one stage waits no more than the
    schedule's bubble, another past it by >= 0.10, the first computing >= 1.1x the other's time a step,
    and an even split at (p-1)/m taking less than the step) is said as such: recoverable and severity then
    from the step less the stages' mean compute at (p-1)/m (what an even split would take), and for
    DeepSpeed's PipelineModule (not Megatron-DeepSpeed's GPTModelPipe) the fix moves layers to the lighter
    stage by its partition_method, named without a value (DeepSpeed keeps no record of the one used); a
    schedule-bound bubble gets no balancing fix."""
    got = measure(trace, metrics)
    if got is None:
        return []
    p, m, by_rank = got.p, got.m, got.by_rank
    measured, ideal = float(by_rank.max()), got.ideal
    if measured < MIN_BUBBLE or (measured <= ideal + TOLERANCE and ideal <= SCHEDULE_LIMIT):
        return []
    if ideal <= SCHEDULE_LIMIT and host_made(got):  # (the premise is the wait past the schedule's)
        return []
    compute = got.step_s / (1 + measured)
    cost = Cost(got.step_s - compute, got.step_s)
    counted = "counted from the pipeline's sends" if got.m_source == "sends" else "as configured"
    split = unbalanced(got)
    # the bubble above what 4(p-1) microbatches leave: continuous in the measure (it was the excess
    # over (p-1)/m, else half the schedule's: 1.4 ms at a measured 0.52 and 22.8 ms at 0.49 for the
    # same job, m=2 p=2); an unbalanced split: the step less the stages' mean compute at the
    # schedule's own bubble (what an even split would take)
    recoverable = max(measured - (p - 1) / max(m, 4 * (p - 1)), 0.0) * compute
    title = f"pipeline bubble {measured:.2f} vs the schedule's (p-1)/m = {ideal:.3g}"
    why = (
        f"stages wait on send/recv for {measured:.0%} of compute ({float(got.fraction_by_rank.max()):.0%} "
        f"of the step; the schedule's (p-1)/(m+p-1) = {got.ideal_fraction:.0%}): the bubble {cost.text}."
    )
    if split is not None:
        (heavy, heavy_s), (light, light_s) = split
        title = (
            f"pipeline stages unbalanced: {rank_name(light)} waits {measured:.2f} of its compute on "
            f"send/recv, {rank_name(heavy)} {float(by_rank[heavy]):.2f} "
            f"(the schedule's (p-1)/m = {ideal:.3g})"
        )
        recoverable = even_split_saves(got)
        cost = Cost(recoverable, got.step_s)  # what an even split would save, not the whole wait
        why = (
            f"{rank_name(heavy)}'s stage computes {heavy_s * 1e3:.0f} ms a step, {rank_name(light)}'s "
            f"{light_s * 1e3:.0f} ms: the lighter stage waits for the heavier one beyond the schedule's "
            f"(p-1)/(m+p-1) = {got.ideal_fraction:.0%} of the step; against an even split at that "
            f"bubble, the imbalance {cost.text}."
        )
    return [
        Finding(
            severity=cost.severity,
            title=title,
            detail=f"p={p} stages, m={m} microbatches ({counted}); {why} {_over(got)}",
            evidence={
                **cost.evidence(),
                "pp": p,
                "microbatches": m,
                "microbatches_source": got.m_source,
                "microbatches_configured": got.m_config,
                "sends_per_step_by_rank": evidence.by_rank(got.sends_by_rank, int),
                "bubble_ideal": ideal,
                "bubble_measured": measured,
                "bubble_by_rank": evidence.by_rank(by_rank),
                "bubble_fraction_ideal": got.ideal_fraction,
                "bubble_fraction_measured": float(got.fraction_by_rank.max()),
                "bubble_steps_measured": got.steps[0],
                "steady_steps": got.steps[1],
            },
            ranks=[
                int(r) for r in by_rank.index[by_rank >= max(MIN_BUBBLE, min(ideal + TOLERANCE, measured))]
            ],
            recoverable_s=recoverable,
            fixes=_fixes(trace, framework.job_of(metrics), p, m, split),
        )
    ]
