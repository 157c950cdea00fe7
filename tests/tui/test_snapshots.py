"""SVG snapshots of the main screens (pytest-textual-snapshot). Deterministic: a fixed synthetic
8-rank trace with fixed timestamps, replayed all at once, fixed terminal size, no clock shown,
a fixed analyzer result. Update with `pytest tests/tui/test_snapshots.py --snapshot-update`."""

from __future__ import annotations

import pytest
from diag.analyzers import Finding, Fix

from diag.tui.app import TopApp
from diag.tui.source import ReplaySource
from tests.tui.conftest import screen_shows, settled, wait_for
from tests.tui.synth import SynthJob

SIZE = (150, 36)


def _findings(trace):
    return [
        Finding(
            rule="straggler",
            severity="warning",
            title="rank 5 is 1.6x slower than the median",
            detail="rank 5 took 160 ms per step, the median rank 100 ms",
            ranks=[5],
            recoverable_s=0.06,
            fixes=[Fix("check rank 5's host (node0) for throttling", env={"NCCL_DEBUG": "INFO"})],
        )
    ], {}


STEPS = 12
RANKS = 8


@pytest.fixture
def app(tmp_path) -> TopApp:
    job = SynthJob(str(tmp_path), RANKS, slow_rank=5, t0=1_700_000_000_000_000_000, overflow_at=3)
    for step in range(STEPS):
        job.write_step(step)
    job.close()
    return TopApp(ReplaySource(str(tmp_path), speed=0, label="sample"), analyze=_findings, interval=0.05)


def _ready(app: TopApp):
    async def run_before(pilot) -> None:
        # every step read and shown, the analysis' marks in the cells and the columns widened to them
        await wait_for(
            pilot,
            lambda: (
                app.pump.caught_up(app.view)
                and len(app.view.rank_rows) == RANKS
                and all(r.step == STEPS - 1 for r in app.view.rank_rows)
            ),
        )
        await wait_for(pilot, settled(app, "ranks-table"))
        await wait_for(pilot, screen_shows(app, "ranks-table"))
        await pilot.pause()

    return run_before


@pytest.mark.parametrize(
    "keys",
    [[], ["2"], ["3"], ["4"], ["6"], ["s"], ["enter"], ["question_mark"]],
    ids=["ranks", "collectives", "layers", "overflow", "findings", "sorted", "rank-drill-in", "help"],
)
def test_screens(snap_compare, app, keys):
    assert snap_compare(app, press=keys, terminal_size=SIZE, run_before=_ready(app))
