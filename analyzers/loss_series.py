"""The logged training loss as the loss rules read it, and their fixes in the job's own framework.

Shared by `loss_spike` and `loss_climb` (rules do not import each other)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import framework

from diag.findings import Fix

if TYPE_CHECKING:
    from diag.trace.model import Trace


def losses(trace: Trace) -> pd.DataFrame:
    """One row per logged iteration: step, loss (first rank that printed it), nonfinite flag (see
    `diag.importers.logs.records`: a printed nan/inf, not a line without a loss)."""
    log = trace.frame("log_step")
    if log.empty or "loss" not in log.columns:
        return pd.DataFrame(columns=["step", "loss", "nonfinite"])
    d = log[["step", "loss"]].assign(
        loss=pd.to_numeric(log["loss"], errors="coerce"),
        nonfinite=(
            log["loss_nonfinite"].astype("boolean").fillna(False)
            if "loss_nonfinite" in log.columns
            else False
        ),
    )
    d = d[d["loss"].notna() | d["nonfinite"]]
    return d.sort_values("step", kind="stable").groupby("step", as_index=False).first()


def finite(trace: Trace) -> pd.DataFrame:
    """`losses` without the nan/inf ones (those are `nan_loss`'s)."""
    series = losses(trace)
    return series[~series["nonfinite"].astype(bool)] if not series.empty else series


def clip_fix(trace: Trace, what: str) -> list[Fix]:
    """Gradient clipping at 1.0 where the job does not clip that tightly yet, named in its framework:
    `--clip-grad` for Megatron-LM (its parser has it), ds_config `gradient_clipping` under DeepSpeed
    (Megatron-DeepSpeed included), the text alone where the framework is another or not known."""
    job = framework.detect(trace)
    if job.framework == framework.MEGATRON_LM:
        clip = job.arg("clip_grad")
        if isinstance(clip, (int, float)) and 0 < clip <= 1.0:
            return []
        args = job.flags("--clip-grad", "1.0")
        return [Fix(what, megatron_args=args)] if args else [Fix(what)]
    if job.deepspeed is False:
        return [Fix(what)]
    clip = job.ds_config.get("gradient_clipping")
    if isinstance(clip, (int, float)) and 0 < clip <= 1.0:
        return []
    lead = "" if job.deepspeed else "if the job uses DeepSpeed: "
    return [Fix(lead + what, ds_config={"gradient_clipping": 1.0})]
