"""`trace_doc.steps`: the report's per-step rows made for every step at once are those one step's
rows give (the slowest rank's time and samples/s, the fastest's time, whether any rank sampled
FLOPs, the mean FLOP/s over ranks: numpy's sum in row order, not a groupby's compensated one)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.report.records import Records, materialize, plain
from diag.report.trace_doc import steps
from diag.trace.model import Trace


def _one_step_at_a_time(df: pd.DataFrame, applied: pd.Series) -> list[dict]:
    out = []
    for step, g in df.groupby("step"):
        slow = g.loc[g["dur_ns"].idxmax()]
        out.append(
            {
                "step": int(step),
                "ranks": len(g),
                "max_ms": slow["dur_ns"] / 1e6,
                "min_ms": g["dur_ns"].min() / 1e6,
                "slowest_rank": int(slow["rank"]),
                "applied": bool(applied.get(step, True)),
                "sampled": bool(g["sampled"].any()),
                "tflops": g["tflops"].mean(),
                "samples_per_s": slow["samples"] / slow["dur_ns"] * 1e9,
            }
        )
    return out


def test_every_step_at_once_is_each_step_alone():
    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(1, 600))
        df = pd.DataFrame(
            {
                "rank": rng.integers(0, 64, n),
                "step": rng.integers(0, 12, n),
                "dur_ns": np.where(rng.random(n) < 0.2, 5, rng.integers(1, 10**9, n)),  # ties at 5
                "samples": np.where(rng.random(n) < 0.2, np.nan, rng.integers(1, 64, n).astype(float)),
                "sampled": rng.random(n) < 0.3,
                "tflops": np.where(
                    rng.random(n) < 0.3, np.nan, rng.random(n) * 10.0 ** rng.integers(-3, 3, n)
                ),
            }
        )
        st = pd.DataFrame({"rank": df["rank"], "step": df["step"], "applied": rng.random(n) < 0.9})
        applied = st["applied"].astype("boolean").fillna(True).groupby(st["step"]).all()
        got = plain(materialize(steps(Records(df), Trace(frames={"step": st}))))  # (as the renderers read it)
        want = plain(_one_step_at_a_time(df, applied))
        assert got == want, trial
        assert [type(v) for row in got for v in row.values()] == [
            type(v) for row in want for v in row.values()
        ]
