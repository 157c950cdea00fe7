"""`Tails`: each rank's last records and calls reduced, the same whether reduced whole or a window
of steps at a time and merged (the windowed pass, docs/scale.md), and what the hang and crash rules
read of it the same."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np
import pandas as pd
import pytest
from diag.analyzers import hang_desync

from diag import schema
from diag.metrics.comms import comm_frame
from diag.metrics.lasts import KINDS, Tails
from diag.metrics.stage import Metrics
from diag.trace.model import Trace
from diag.trace.reader import load_trace
from tests.unit.synth_trace import Job
from tests.unit.test_fault_rules import _hung_job, _stuck

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDERS = [
    "tests/fixtures/hang_killed_early",
    "tests/fixtures/pp2_starved",
    "sample_traces/zero3",
    "sample_traces/megatron_tp2",
    "sample_traces/straggler",
]


def _step(df: pd.DataFrame) -> pd.Series:
    """Each row's step, -1 where it has none (the outside part)."""
    if "step" not in df:
        return pd.Series(-1, index=df.index)
    return pd.to_numeric(df["step"], errors="coerce").fillna(-1)


def _windows(m: Metrics, size: int) -> list[Tails]:
    """`m`'s calls, entered calls and records a window of `size` steps at a time, step -1 first."""
    c = m.comms
    o = m.trace.frame(schema.COMM_OPEN)
    opened = comm_frame(o.assign(dur=None), m.steps) if not o.empty else None
    frames: Mapping[str, pd.DataFrame] = {k: f for k, f in m.trace.frames.items() if k in KINDS}
    everything = [c, *([opened] if opened is not None else []), *frames.values()]
    steps = np.sort(pd.unique(np.concatenate([_step(f).to_numpy() for f in everything])))
    parts = []
    for i in range(0, len(steps), size):
        keep = steps[i : i + size]
        part = {k: f[_step(f).isin(keep)] for k, f in frames.items()}
        held = opened[_step(opened).isin(keep)] if opened is not None else None
        parts.append(Tails.of(c[_step(c).isin(keep)], held, part))
    return parts


def _same(a: Tails, b: Tails) -> None:
    assert a.calls == b.calls
    assert a.latest.keys() == b.latest.keys()
    for kind in a.latest:
        pd.testing.assert_series_equal(a.latest[kind], b.latest[kind], check_dtype=False, check_exact=True)
    for name in ("groups", "last", "pending", "opened"):
        got, want = getattr(a, name), getattr(b, name)
        pd.testing.assert_frame_equal(
            got.reset_index(drop=True).astype(object),
            want.reset_index(drop=True).astype(object),
            check_exact=True,
            obj=name,
        )
    assert a.latest_end == b.latest_end or (math.isnan(a.latest_end) and math.isnan(b.latest_end))
    assert hang_desync.last_collectives(a) == hang_desync.last_collectives(b)
    assert list(hang_desync.last_collectives(a)) == list(hang_desync.last_collectives(b))


def _merged_equal_the_whole(m: Metrics, size: int) -> list[Tails]:
    whole = m.lasts
    parts = _windows(m, size)
    merged = parts[0]
    for p in parts[1:]:
        merged = merged.merge(p)
    _same(merged, whole)
    _same(Tails.merged(parts), whole)
    return parts


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("size", [1, 3, 100000])
def test_windows_merged_equal_the_whole(folder, size):
    m = Metrics(load_trace(os.path.join(ROOT, folder)))
    assert m.calls, "a trace with collectives"
    parts = _merged_equal_the_whole(m, size)
    if size == 1 and len(parts) > 2:  # the merge is what makes them equal: one window is not
        assert parts[1].calls < m.lasts.calls


def _entered_hang(tmp_path) -> Trace:
    """Rank 1 stops after step 5; rank 0's step-6 all-reduce never completes (a null duration),
    and its next one is on disk as entered only (`comm_open`); calls given up on in earlier steps,
    each rank's, so that windows hold pending calls of both ranks in turn."""
    job: Job = _hung_job()
    calls = {r: [e for e in job.events[r] if e["k"] == schema.COMM] for r in (0, 1)}
    for r, k in ((0, 1), (1, 0), (1, 2), (0, 4)):  # rank 1's step-0 one before rank 0's step-1 one
        calls[r][k]["dur"] = None
    job.comm(0, 6, at_ms=80, dur_ms=0)
    held = job.events[0].pop()
    job.add(0, schema.COMM_OPEN, **{k: held[k] for k in schema.FIELDS[schema.COMM]} | {"dur": None})
    _stuck(job, end_ms=12000, beats_to={1: 600})
    return job.write(str(tmp_path / "entered"))


@pytest.mark.parametrize("size", [1, 3, 100000])
def test_pending_and_entered_calls_merge(tmp_path, size):
    m = Metrics(_entered_hang(tmp_path))
    assert len(m.lasts.pending) == 5 and len(m.lasts.opened) == 1
    assert m.lasts.entered([0])["dur"].isna().all() and len(m.lasts.entered([0])) == 4
    _merged_equal_the_whole(m, size)
