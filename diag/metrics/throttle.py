"""A rank throttled from outside, read post-mortem from the watcher's looks (`Trace.proc`).

Live, `diag watch` hands the straggler rule its looks of the last `window_s` seconds as the header's
`process` fact (`stopped_share`, `resumes`, `looked_s`, `first_stop_ns`). After the job, the same
looks are in the trace directory, one record per rank and second (diag.live.proc_log); this slides
the live window over them and keeps the span in which a window would have met the live thresholds:
from the first to the last second with a stop in such a window. That span's fact has the live
fact's keys plus `last_stop_ns`, so the rule weighs the steps begun while the rank was throttled,
not the whole run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

NS = 1e9
# the looks the live fact counts: those of the last 5 s (diag.live.rank_deaths `Deaths.duty`), a
# window post-mortem slides over the looks written once a second
WINDOW_S = 5.0


def throttled_spans(
    proc: pd.DataFrame, window_s: float, share: float, resumes: int
) -> dict[int, dict[str, Any]]:
    """Per watched rank: the span of its seconds with a stop inside a `window_s` window seen
    stopped at >= `share` of its looks with >= `resumes` resumes; none if no window was."""
    if proc.empty or "of_rank" not in proc:
        return {}
    out = {}
    for rank, recs in proc.groupby("of_rank", sort=True):
        fact = _span(recs.sort_values("ts", kind="stable"), window_s, share, resumes)
        if fact:
            out[int(rank)] = fact
    return out


def _span(recs: pd.DataFrame, window_s: float, share: float, resumes: int) -> dict[str, Any]:
    import pandas as pd

    cols = ["ts", "looks", "stopped", "resumes"]
    r = recs[cols].apply(pd.to_numeric, errors="coerce").fillna(0).astype("int64")
    ts = r["ts"].to_numpy()
    hot = [False] * len(r)
    for end in ts:  # the window of the live rule, ending at each record
        inside = (ts > end - window_s * NS) & (ts <= end)
        looks, stopped, back = (int(r[c][inside].sum()) for c in ("looks", "stopped", "resumes"))
        if looks and stopped / looks >= share and back >= resumes:
            for j in inside.nonzero()[0]:
                hot[j] = hot[j] or int(r["stopped"].iloc[j]) > 0
    if not any(hot):
        return {}
    first, last = hot.index(True), len(hot) - 1 - hot[::-1].index(True)
    span = r.iloc[first : last + 1]
    stops = pd.to_numeric(recs["first_stop"].iloc[first : last + 1], errors="coerce").dropna()
    ends = pd.to_numeric(recs["last_stop"].iloc[first : last + 1], errors="coerce").dropna()
    start = int(ts[first]) - int(pd.to_numeric(recs["span"].iloc[first], errors="coerce") or 0)
    return {
        "stopped_share": float(span["stopped"].sum() / max(1, span["looks"].sum())),
        "resumes": int(span["resumes"].sum()),
        "looked_s": (int(ts[last]) - start) / NS,
        "first_stop_ns": int(stops.min()) if len(stops) else start,
        "last_stop_ns": int(ends.max()) if len(ends) else int(ts[last]),
        "checked_ns": int(ts[last]),
        "source": "watch file",
    }
