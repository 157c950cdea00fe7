"""What each rank's device was doing: the intervals the breakdown and overlap figures are built on.

GPU traces: the GPU kernels (incl. memcpy/memset) launched before the last ProfilerStep started, as
Holistic Trace Analysis counts them (its default drops the last, often incomplete, step). CPU-only
traces have no device timeline: compute is the union of host ops on the thread running the
ProfilerSteps, communication the collectives' execution (gloo thread), with the same cut.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diag import schema
from diag.metrics.comms import between_ranks
from diag.vocab import COMM, COMPUTE

if TYPE_CHECKING:
    from diag.trace.model import Trace

_NOT_COMPUTE = ("ProfilerStep", "c10d::", "record_param_comms", "gloo:", "Optimizer.", "##")


def _cut(steps: pd.DataFrame) -> int | None:
    """The start of a rank's last step (`steps`: its rows of the step frame)."""
    starts = steps["ts"]
    return int(starts.max()) if len(starts) >= 2 else None


def gpu_activity(kernels: pd.DataFrame, cut: int | None) -> pd.DataFrame:
    k = kernels
    if cut is not None:  # as HTA: only kernels a host op launched before the last step began
        k = k[(k["launch_ts"] >= 0) & (k["launch_ts"] < cut)]
    return pd.DataFrame(
        {
            "ts": k["ts"].to_numpy(),
            "end": (k["ts"] + k["dur"]).to_numpy(),
            "kind": k["kind"].astype(str).to_numpy(),
        }
    )


def cpu_activity(ops: pd.DataFrame, comms: pd.DataFrame, cut: int | None) -> pd.DataFrame:
    prof = ops[ops["name"].astype(str).str.startswith("ProfilerStep")]
    main = prof["tid"].iloc[0] if len(prof) else None
    names = ops["name"].astype(str)
    comp = ops[
        (ops["tid"] == main) & (ops["cat"].astype(str) == "cpu_op") & ~names.str.startswith(_NOT_COMPUTE)
    ]
    parts = [
        pd.DataFrame(
            {"ts": comp["ts"].to_numpy(), "end": (comp["ts"] + comp["dur"]).to_numpy(), "kind": COMPUTE}
        ),
        pd.DataFrame(
            {"ts": comms["ts"].to_numpy(), "end": (comms["ts"] + comms["dur"]).to_numpy(), "kind": COMM}
        ),
    ]
    df = pd.concat(parts, ignore_index=True)
    return df[df["ts"] < cut] if cut is not None else df


class ByRank:
    """A frame's rows of one rank at a time. Where each rank's rows are is found in one pass on first
    use (a mask per rank scans the whole frame once per rank: quadratic in the ranks of a many-rank
    trace); the rows themselves are taken at each call and not kept: every rank's rows taken at once
    were a copy of the whole frame (+390 MiB in idle_between_steps' comm frame at 64 ranks x 1,000
    steps). A trace's frames are sorted by rank, so a rank's rows are a slice: a view, no copy."""

    def __init__(self, df: pd.DataFrame) -> None:
        self.df = df
        self._rows: dict[Any, slice | np.ndarray] | None = None

    def __getitem__(self, rank: int) -> pd.DataFrame:
        if self._rows is None:
            self._rows = _rows_by_rank(self.df)
        rows = self._rows.get(rank)
        return self.df.iloc[rows] if rows is not None else self.df.iloc[:0]


def _rows_by_rank(df: pd.DataFrame) -> dict[Any, slice | np.ndarray]:
    """rank -> its rows' positions in `df`: a slice where the ranks are integers in ascending order
    (a trace's frames), else the groupby's index arrays."""
    if not len(df):
        return {}
    rank = df["rank"]
    if rank.dtype.kind in "iu" and rank.is_monotonic_increasing:
        values = rank.to_numpy()
        bounds = [0, *(np.flatnonzero(values[1:] != values[:-1]) + 1).tolist(), len(values)]
        return {values[a]: slice(a, b) for a, b in itertools.pairwise(bounds)}
    return dict(df.groupby("rank", sort=False).indices)


class Activities:
    """`activity` of every rank of one trace, each frame split by rank once."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.kernels = ByRank(trace.frame("kernel"))
        self.ops = ByRank(trace.frame("cpu_op"))
        self.comms = ByRank(between_ranks(trace.frame(schema.COMM)))  # a rank alone moves nothing
        self.steps = ByRank(trace.frame(schema.STEP))

    def __call__(self, rank: int) -> tuple[pd.DataFrame, str]:
        """(intervals ts/end/kind, "gpu" or "cpu") of one rank."""
        cut = _cut(self.steps[rank])
        kernels = self.kernels.df
        mine = self.kernels[rank] if "kind" in kernels.columns else kernels.iloc[:0]
        if len(mine):
            return gpu_activity(mine, cut), "gpu"
        if "tid" not in self.ops.df.columns:
            return pd.DataFrame(columns=["ts", "end", "kind"]), "none"
        return cpu_activity(self.ops[rank], self.comms[rank], cut), "cpu"


def activity(trace: Trace, rank: int) -> tuple[pd.DataFrame, str]:
    """(intervals ts/end/kind, "gpu" or "cpu") of one rank (`Activities` for many ranks)."""
    return Activities(trace)(rank)
