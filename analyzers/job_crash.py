"""A failed job, from its log: what failed, on which rank, at which iteration, with the line itself.

The log importer (`diag.importers.logs.crash`) reads every sign of failure into `log_failure` and marks
the one its statement leads with (`first`): an OOM over an NCCL timeout over an exception over an
interrupt over a bare exit code, the earliest of that kind. This rule turns it into a finding, keeping
each rank's exit code from the launcher lines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
from diag.analyzers.base import rule

from diag.findings import Finding, Fix

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

_WHAT = {"oom": "CUDA out of memory", "nccl_timeout": "NCCL collective timeout", "interrupted": "interrupted"}


def _val(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and v != v) else v


def _int(v: Any) -> int | None:
    v = _val(v)
    return None if v is None else int(v)


@rule("job_crash")
def job_crash(trace: Trace, metrics: Metrics) -> list[Finding]:
    """Fires when a log shows the job failed (a traceback it did not survive, CUDA OOM, the NCCL watchdog,
    a launcher's non-zero exit code or signal): always critical. No threshold. Fix: by failure kind (OOM:
    the framework's batch / recompute / parallelism settings; NCCL timeout: the desynced rank's stack)."""
    fail = trace.frame("log_failure")
    if fail.empty or "first" not in fail.columns:
        return []
    chosen = fail[fail["first"].astype("boolean").fillna(False)]
    if chosen.empty:
        return []
    chosen = chosen.assign(_t=pd.to_numeric(chosen["ts"], errors="coerce")).sort_values(["_t", "line"])
    first = chosen.iloc[0]
    exits = fail[fail["exc"].astype(str) == "exit"]
    codes = {
        int(r): int(c)
        for r, c in zip(exits["rank"], pd.to_numeric(exits["code"], errors="coerce"))
        if c == c and r >= 0
    }
    kind, rank, step = str(first["kind"]), int(first["rank"]), int(first["step"])
    what = (
        f"process ended with {first['message']}"
        if first["exc"] == "exit"
        else _WHAT.get(kind, str(first["exc"]))
    )
    where = f"rank {rank}" if rank >= 0 else "a rank the log does not name"
    same = fail[(fail["kind"] == first["kind"]) & (fail["exc"] == first["exc"])]
    ev: dict[str, Any] = {
        "kind": kind,
        "exception": str(first["exc"]),
        "message": str(first["message"]),
        "first_rank": rank,
        "ranks": sorted({int(r) for r in same["rank"] if r >= 0}),
        "last_completed_step": step,
        "failed_iteration": step + 1,
        "path": _val(first.get("path")),
        "line": int(first["line"]),
        "log_line": _val(first.get("text")),
        "exit_codes": codes,
        "signal": _val(first.get("signal")) or next((_val(s) for s in exits["signal"] if _val(s)), None),
    }
    if kind == "nccl_timeout":
        ev.update(seq=_int(first.get("seq")), op=_val(first.get("op")))
    fixes = [Fix(str(first["fix"]))] if _val(first.get("fix")) else []
    if kind == "nccl_timeout":
        fixes.append(
            Fix(
                "look at the rank(s) on another sequence number: their stacks (py-spy dump / "
                "`diag stacks`) and Flight Recorder dumps say where they were",
                env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"},
            )
        )
    return [
        Finding(
            severity="critical",
            title=(
                f"job crashed at iteration {step + 1}: {what} on {where}"
                if step
                else f"job crashed before its first step: {what} on {where}"
            ),
            detail=str(_val(first.get("statement")) or what),
            evidence=ev,
            ranks=sorted({int(r) for r in fail["rank"] if r >= 0}),
            steps=[step + 1],
            fixes=fixes,
        )
    ]
