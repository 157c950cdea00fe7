"""A nan / inf training loss, from the log: printed as such, or counted by Megatron (`number of nan
iterations`). Reads the log's step records (`log_step`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import framework
from diag.analyzers.base import rule
from diag.analyzers.loss_series import clip_fix

from diag.findings import Finding, Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace


@rule("nan_loss")
def nan_loss(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when the log prints a nan or inf training loss, or Megatron counts nan iterations
    (`number of nan iterations` > 0): always critical, since the weights may already be corrupt.
    Fix: restart from the last checkpoint before it, with gradient clipping, a lower LR, bf16."""
    log = trace.frame("log_step")
    if log.empty or "loss" not in log.columns:
        return []
    flag = (
        log["loss_nonfinite"].astype("boolean").fillna(False)
        if "loss_nonfinite" in log.columns
        else pd.Series(False, index=log.index)
    )
    series = pd.DataFrame(
        {
            "step": log["step"].astype(int),
            "nonfinite": flag,
            "loss": pd.to_numeric(log["loss"], errors="coerce"),
        }
    )
    series = series.sort_values("step", kind="stable")
    series = series[series["loss"].notna() | series["nonfinite"]].drop_duplicates("step")
    bad = series[series["nonfinite"]]
    nan_iters = (
        pd.to_numeric(log["nan_iters"], errors="coerce")
        if "nan_iters" in log.columns
        else pd.Series(dtype=float)
    )
    counted = log.loc[nan_iters.fillna(0) > 0, "step"] if len(nan_iters) else pd.Series(dtype=int)
    if bad.empty and counted.empty:
        return []
    steps = sorted({int(s) for s in bad["step"]} | {int(s) for s in counted})
    first = steps[0]
    before = series[(series["step"] < first) & ~series["nonfinite"]]
    last_ok = (int(before["step"].iloc[-1]), float(before["loss"].iloc[-1])) if not before.empty else None
    return [
        Finding(
            severity="critical",
            title=f"training loss became nan/inf at step {first}",
            detail=(
                f"{len(bad)} logged iteration(s) had a nan/inf loss (printed, or left out by Megatron)"
                + (
                    f"; Megatron counted {int(nan_iters.fillna(0).sum())} nan iteration(s)"
                    if len(counted)
                    else ""
                )
                + (f"; the last finite loss was {last_ok[1]:.4g} at step {last_ok[0]}." if last_ok else ".")
            ),
            evidence={
                "first_step": first,
                "nonfinite_steps": len(bad),
                "nan_iterations": int(nan_iters.fillna(0).sum()) if len(nan_iters) else 0,
                "last_finite": {"step": last_ok[0], "loss": last_ok[1]} if last_ok else None,
            },
            steps=steps[:50],
            fixes=_fixes(trace, framework.job_of(metrics)),
        )
    ]


def _fixes(trace: Trace, job: framework.Job) -> list[Fix]:
    """Clipping and a lower LR, bf16 for fp16, each in the job's own terms (`loss_series.clip_fix`):
    DeepSpeed's config, Megatron-LM's flags, the words alone for a job neither runs (torchtitan,
    nanoGPT, a plain DDP loop), a DeepSpeed patch only "if the job uses DeepSpeed" where not known."""
    restart = "restart from the last checkpoint before the nan"
    fixes = clip_fix(trace, restart + " with gradient clipping and a lower LR") or [
        Fix(restart + " with a lower LR")
    ]
    bf16 = "in fp16, move to bf16 (Ampere+): no overflow into inf"
    if job.framework == framework.MEGATRON_LM:
        if not job.arg("bf16") and (args := job.flags("--bf16")):
            fixes.append(Fix(bf16, megatron_args=args))
    elif job.deepspeed is not False:
        lead = "" if job.deepspeed else "if the job uses DeepSpeed: "
        fixes.append(Fix(lead + bf16, ds_config={"bf16": {"enabled": True}, "fp16": {"enabled": False}}))
    return fixes
