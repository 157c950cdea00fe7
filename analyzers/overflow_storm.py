"""fp16 overflow storm / loss-scale collapse: steps keep being skipped after the scale has settled."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import config, evidence, framework
from diag.analyzers.base import rule

from diag.findings import Cost, Finding, Fix, severity_of
from diag.metrics.agg import named
from diag.metrics.overflows import LOG_SOURCES, one_source

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

RATE = 0.10  # overflow share of steps after the initial calibration
MIN_OVERFLOWS = 3  # and at least this many of them
COLLAPSE_SCALE = 1.0  # or the loss scale fell to this (or to min_loss_scale)
# or every recorded step was skipped, and more of them than a calibration takes (halving from 2^32
# with hysteresis 2 skips at most 64): the job never trained
ALL_SKIPPED_STEPS = 64


def per_step(trace: Trace, logged: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, step): overflow seen, last loss scale. A log's overflow rows are its
    skipped iterations only: the iterations it timed (`logged`, rank and step) are the steps that
    were not (from the log alone, 7 skipped of 40 iterations read as 7 of 7, all calibration)."""
    of = one_source(trace.overflow)  # a trace and its log record the same skips: count them once
    if of.empty:
        return pd.DataFrame(columns=["rank", "step", "overflow", "scale"])
    df = of.assign(
        overflow=of["overflow"].fillna(False).astype(bool),
        scale=pd.to_numeric(of["scale_after"], errors="coerce"),
    )
    by_step = df.sort_values("ts", kind="stable").groupby(["rank", "step"], observed=True)
    df = named(by_step, overflow=("overflow", "any"), scale=("scale", "last")).reset_index()
    from_log = "source" in of.columns and of["source"].astype(str).isin(LOG_SOURCES).all()
    if not from_log or logged is None or logged.empty:
        return df
    steps = pd.to_numeric(logged["step"], errors="coerce").dropna().astype(int).unique()
    have = set(zip(df["rank"].astype(int), df["step"].astype(int)))
    fill = [(r, s) for r in df["rank"].astype(int).unique() for s in steps if (r, s) not in have]
    extra = pd.DataFrame(fill, columns=["rank", "step"]).assign(overflow=False, scale=float("nan"))
    out = pd.concat([df, extra], ignore_index=True) if fill else df
    return out.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def after_calibration(df: pd.DataFrame) -> pd.DataFrame:
    """Drop each rank's leading run of overflows: dynamic scaling starts high and halves until it fits."""
    if df.empty:
        return df
    d = df.sort_values(["rank", "step"], kind="stable")
    return d[(~d["overflow"]).groupby(d["rank"]).cumsum() > 0]


# gentler fp16 scaling: no initial scale below 2^8 is suggested; window and hysteresis raised to these
GENTLE = {"initial_scale_power": 8, "loss_scale_window": 2000, "hysteresis": 4}


def _fixes(trace: Trace, job: framework.Job) -> list[Fix]:
    """bf16, gentler dynamic scaling and clipping, each only where it changes what the job runs, in its
    framework's terms: ds_config under DeepSpeed (Megatron-DeepSpeed's fp16 too), Megatron-LM flags."""
    fixes = []
    if job.framework == framework.MEGATRON_LM:
        if job.flags("--bf16"):
            fixes.append(
                Fix(
                    "on Ampere or newer (A100/H100/H200) train in bf16 (drop --fp16): same range "
                    "as fp32, no loss scaling",
                    megatron_args=job.flags("--bf16"),
                )
            )
        args: list[str] = []
        scale = job.arg("initial_loss_scale")
        if isinstance(scale, (int, float)) and scale > 2 ** (GENTLE["initial_scale_power"] + 4):
            args += ["--initial-loss-scale", str(int(scale) >> 4)]
        window = job.arg("loss_scale_window")
        if isinstance(window, (int, float)) and window < GENTLE["loss_scale_window"]:
            args += ["--loss-scale-window", str(GENTLE["loss_scale_window"])]
        hyst = job.arg("hysteresis")
        if isinstance(hyst, (int, float)) and hyst < GENTLE["hysteresis"]:
            args += ["--hysteresis", str(GENTLE["hysteresis"])]
        if args and job.flags(*args):
            fixes.append(
                Fix(
                    "keep fp16 but scale more gently (lower start, longer growth window, tolerate "
                    "isolated overflows)",
                    megatron_args=job.flags(*args),
                )
            )
        clip = job.arg("clip_grad")
        if isinstance(clip, (int, float)) and (clip <= 0 or clip > 1.0) and job.flags("--clip-grad", "1.0"):
            fixes.append(
                Fix(
                    "a persistent inf usually comes from real divergence: clip gradients and lower the LR",
                    megatron_args=job.flags("--clip-grad", "1.0"),
                )
            )
        return fixes
    if job.hf_trainer:  # its precision is TrainingArguments', which fill (and must match) ds_config's
        fixes.append(
            Fix(
                "on Ampere or newer (A100/H100/H200) train in bf16: TrainingArguments(bf16=True, "
                "fp16=False) (--bf16); the HF Trainer fills ds_config's 'auto' precision from them and "
                "refuses a ds_config value that differs",
                ds_config={"fp16": {"enabled": False}, "bf16": {"enabled": True}} if job.deepspeed else None,
            )
        )
    if job.deepspeed is False:
        return fixes
    lead = "" if job.deepspeed else "if the job uses DeepSpeed: "
    if not job.hf_trainer:
        fixes.append(
            Fix(
                f"{lead}on Ampere or newer (A100/H100/H200) train in bf16: same range as fp32, no loss "
                "scaling",
                ds_config={"fp16": {"enabled": False}, "bf16": {"enabled": True}},
            )
        )
    power = int(config.setting(trace, "initial_scale_power"))
    window = int(config.setting(trace, "loss_scale_window"))
    hyst = int(config.setting(trace, "hysteresis"))
    gentle: dict[str, object] = {}
    if power > GENTLE["initial_scale_power"]:
        gentle["initial_scale_power"] = max(power - 4, GENTLE["initial_scale_power"])
    for key, now in (("loss_scale_window", window), ("hysteresis", hyst)):
        if now < GENTLE[key]:
            gentle[key] = GENTLE[key]
    if gentle:
        seen = "" if job.config_seen else " (no fp16 config was recorded: DeepSpeed's defaults assumed)"
        fixes.append(
            Fix(
                f"{lead}keep fp16 but scale more gently: "
                + ", ".join(f"{k} {v}" for k, v in gentle.items())
                + seen,
                ds_config={"fp16": gentle},
            )
        )
    clip = job.ds_config.get("gradient_clipping")
    if not (isinstance(clip, (int, float)) and 0 < clip <= 1.0):
        fixes.append(
            Fix(
                f"{lead}a persistent inf usually comes from real divergence: clip gradients and lower the LR"
                + (
                    " (TrainingArguments(max_grad_norm=1.0): the HF Trainer fills it)"
                    if job.hf_trainer
                    else ""
                ),
                ds_config={"gradient_clipping": 1.0},
            )
        )
    return fixes


def _all_skipped(df: pd.DataFrame, metrics: Metrics) -> bool:
    """Every step the job recorded (trace steps or log iterations: a log lists only the skipped
    ones among its overflow rows) was skipped, and at least `ALL_SKIPPED_STEPS` of them."""
    hit = set(df.loc[df["overflow"], "step"].astype(int))
    known = hit | set(df["step"].astype(int)) | set(metrics.step_times["step"].dropna().astype(int))
    return len(hit) >= ALL_SKIPPED_STEPS and hit >= known


def _never_applied(df: pd.DataFrame, fixes: list[Fix]) -> Finding:
    """Every recorded step was skipped: not a calibration, the job trained nothing."""
    steps = sorted({int(s) for s in df["step"]})
    scale = df["scale"].dropna()
    where = f"; loss scale went from {scale.max():g} down to {scale.min():g}" if len(scale) else ""
    return Finding(
        severity="critical",
        title=f"fp16 overflow on every step: all {len(steps)} recorded steps skipped, no update applied",
        detail=f"steps {steps[0]}-{steps[-1]} were all skipped for overflow{where}.",
        evidence={
            "overflow_steps": len(steps),
            "steps": len(steps),
            "overflow_rate": 1.0,
            "min_scale": float(scale.min()) if len(scale) else None,
        },
        ranks=sorted(int(r) for r in df["rank"].unique() if int(r) >= 0),
        steps=steps[:50],
        fixes=fixes,
    )


@rule("overflow_storm")
def overflow_storm(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when, after each rank's initial calibration overflows, >= 10% of steps (and >= 3) overflow,
    or when the loss scale collapses to <= max(1, min_loss_scale) from above it, or (critical) every
    recorded step, at least 64 of them, was skipped. Fix (only values that change the job's
    setting, in its framework's terms): bf16 on Ampere+, initial_scale_power - 4 (not below 8),
    loss_scale_window 2000, hysteresis 4, gradient clipping 1.0; Megatron-LM: --bf16,
    --initial-loss-scale, --loss-scale-window, --hysteresis, --clip-grad.
    recoverable_s: skipped steps per step times the median step time (work thrown away). Severity: the
    skipped share of the recorded steps' time; critical when the scale collapsed."""
    df = per_step(trace, metrics.step_times)
    if df.empty:
        return []
    if _all_skipped(df, metrics):
        return [_never_applied(df, fixes=_fixes(trace, framework.job_of(metrics)))]
    post = after_calibration(df)
    # per step, not per rank-step: an overflow makes every rank skip the same step
    n_over, n_steps = post.loc[post["overflow"], "step"].nunique(), post["step"].nunique()
    rate = n_over / max(n_steps, 1)
    floor = max(COLLAPSE_SCALE, float(config.setting(trace, "min_loss_scale")))
    min_scale = float(df["scale"].min()) if df["scale"].notna().any() else None
    # a scale that never stood above the floor did not collapse: Megatron prints `loss scale: 1.0` on
    # every line of a bf16/fp32 run (no grad scaler), whose skipped iterations are NaN-gradient skips
    collapsed = min_scale is not None and min_scale <= floor < float(df["scale"].max())
    if not collapsed and (n_over < MIN_OVERFLOWS or rate < RATE):
        return []
    bad = post[post["overflow"]]
    skipped = df.groupby("rank")["overflow"].sum()
    step_s = metrics.median_step_s
    cost = Cost(n_over * step_s, n_steps * step_s, "of recorded steps") if step_s else None
    lost = f"; the skipped steps' work {cost.text}" if cost else ""
    return [
        Finding(
            # a collapsed scale is a state (the job barely trains), not a time: critical whatever it cost
            severity="critical" if collapsed else cost.severity if cost else severity_of(rate),
            title=(
                f"fp16 loss scale collapsed to {min_scale:g}"
                if collapsed
                else f"fp16 overflow storm: {rate:.0%} of steps skipped after calibration"
            ),
            detail=(
                f"{n_over} overflowing steps after calibration out of {n_steps} steps; "
                f"loss scale went from {df['scale'].max():g} down to {min_scale}{lost}."
            ),
            evidence={
                **(cost.evidence() if cost else {}),
                "overflow_steps": n_over,
                "steps": n_steps,
                "overflow_rate": rate,
                "min_scale": min_scale,
                "max_scale": float(df["scale"].max()),
                "skipped_by_rank": evidence.by_rank(skipped, int),
            },
            ranks=sorted(int(r) for r in bad["rank"].unique()),
            steps=sorted({int(s) for s in bad["step"]})[:50],
            recoverable_s=rate * step_s if step_s else None,
            fixes=_fixes(trace, framework.job_of(metrics)),
        )
    ]
