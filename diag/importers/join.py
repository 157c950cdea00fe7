"""A trace and the log of the same run, joined by the framework's iteration number.

diag's step records carry the number the job gives a step (DeepSpeed's `global_steps`, Megatron's
`iteration`: `collectors/steps.py`), and the log importer keeps the number the log prints, so one
iteration is one row here, however many sources describe it: `step_join` has the trace's time (median
over ranks) next to the log's time and figures (loss, lr, rates, TFLOPs, loss scale), and the step's
overflow once (skipped on any rank in the trace, or a skipped step the log names). A log whose numbers
are shifted against the trace (another numbering, an older diag trace) is detected by the step times:
the shift in +-`MAX_SHIFT` whose times agree best, when it agrees clearly better than none."""

from __future__ import annotations

import pandas as pd

from diag.metrics.agg import named

MAX_SHIFT = 2
CLEARLY = 0.5  # a shift is taken when its median time error is under this share of the unshifted one
MIN_COMMON = 3  # steps with a time in both sources needed to judge a shift
LOG_FIGURES = ("loss", "lr", "grad_norm", "loss_scale", "samples_per_sec", "tokens_per_sec", "tflops")
COLUMNS = ["step", "in_trace", "in_log", "trace_ms", "log_ms", "ranks", "overflow", "log_shift", *LOG_FIGURES]


def _trace_side(steps: pd.DataFrame) -> pd.DataFrame:
    s = steps.assign(dur_ms=pd.to_numeric(steps["dur"], errors="coerce") / 1e6)
    applied = s["applied"].astype("boolean") if "applied" in s.columns else pd.Series(True, index=s.index)
    s = s.assign(skipped=~applied.fillna(True))
    return named(
        s.groupby("step"),
        trace_ms=("dur_ms", "median"),
        ranks=("rank", "nunique"),
        trace_skipped=("skipped", "any"),
    )


def shift(trace_ms: pd.Series, log_ms: pd.Series) -> int:
    """The offset k (log step + k = trace step) under which the two sources' step times agree best."""
    errors = {}
    for k in range(-MAX_SHIFT, MAX_SHIFT + 1):
        moved = log_ms.set_axis(log_ms.index + k)
        both = pd.concat([trace_ms, moved], axis=1, join="inner").dropna()
        if len(both) >= MIN_COMMON:
            errors[k] = float((both.iloc[:, 0] - both.iloc[:, 1]).abs().median())
    if 0 not in errors or not errors:
        return 0
    best = min(errors, key=errors.__getitem__)
    return best if errors[best] < CLEARLY * errors[0] else 0


def join_steps(steps: pd.DataFrame, log: pd.DataFrame, overflow: pd.DataFrame) -> pd.DataFrame:
    """One row per iteration named by the trace or the log (see the module docstring)."""
    if steps.empty or log.empty:
        return pd.DataFrame(columns=COLUMNS)
    t = _trace_side(steps)
    lg = log.groupby("step").first()
    log_ms = (
        pd.to_numeric(lg["iter_ms"], errors="coerce") if "iter_ms" in lg.columns else pd.Series(dtype=float)
    )
    k = shift(t["trace_ms"], log_ms)
    lg.index = lg.index + k
    ov = (
        overflow[overflow["source"].astype(str).str.startswith("log")]
        if "source" in overflow.columns
        else overflow.iloc[0:0]
    )
    log_skipped = set((pd.to_numeric(ov["step"], errors="coerce").dropna().astype(int) + k).tolist())
    out = t.join(
        lg.rename(columns={"iter_ms": "log_ms"})[["log_ms", *[c for c in LOG_FIGURES if c in lg]]],
        how="outer",
    )
    skipped = out["trace_skipped"].astype("boolean").fillna(False).astype(bool)
    out = out.assign(
        in_trace=out.index.isin(t.index),
        in_log=out.index.isin(lg.index),
        log_shift=k,
        overflow=skipped | out.index.isin(list(log_skipped)),
    )
    return out.rename_axis("step").reset_index().reindex(columns=COLUMNS)
