"""A nan / inf training loss, from the log: printed as such, or counted by Megatron (`number of nan
iterations`). Reads the log's step records (`log_step`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers.base import rule

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
                f"{len(bad)} logged iteration(s) printed a nan/inf loss"
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
            fixes=[
                Fix(
                    "restart from the last checkpoint before the nan with gradient clipping and a lower LR",
                    ds_config={"gradient_clipping": 1.0},
                    megatron_args=["--clip-grad 1.0"],
                ),
                Fix(
                    "in fp16, move to bf16 (Ampere+): no overflow into inf",
                    ds_config={"bf16": {"enabled": True}, "fp16": {"enabled": False}},
                ),
            ],
        )
    ]
