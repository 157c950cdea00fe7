"""Steps skipped for fp16 overflow, counted per step: once however many ranks recorded the skip, and
once across a trace and the log of the same job (both record the same skipped iterations; adding them
said "15 overflows" for 5 skipped steps, and "10" for 5 steps on 2 ranks)."""

from __future__ import annotations

import pandas as pd

# overflow rows the log importer wrote (`log_grad_norm`: an HF Trainer step logged with an inf grad norm);
# the agent's have none
LOG_SOURCES = ("log", "log_counter", "log_grad_norm")


def one_source(ov: pd.DataFrame) -> pd.DataFrame:
    """The overflow rows of one source, the trace or the log, whichever recorded more skipped steps
    (a log can hold iterations before the agent attached; a trace steps a log never printed)."""
    if ov.empty or "source" not in ov.columns:
        return ov
    from_log = ov["source"].astype(str).isin(LOG_SOURCES)
    if from_log.all() or not from_log.any():
        return ov
    n_log, n_trace = (skipped(ov[m]) for m in (from_log, ~from_log))
    return ov[from_log] if n_log > n_trace else ov[~from_log]


def skipped(ov: pd.DataFrame) -> int:
    """Distinct steps with an overflow in these rows."""
    if ov.empty or "overflow" not in ov.columns:
        return 0
    hit = ov["overflow"].astype("boolean").fillna(False).to_numpy(bool)
    return int(pd.to_numeric(ov.loc[hit, "step"], errors="coerce").dropna().nunique())


def skipped_steps(ov: pd.DataFrame) -> int:
    """The job's number of steps skipped for overflow (the report's `overflows`)."""
    return skipped(one_source(ov))
