"""`diag top` driven with Pilot: on a real recorded trace (replayed), on a live 2-rank DeepSpeed
job, and at 256 synthetic ranks. Panels are checked against numbers computed with pandas from
`diag.load` of the same trace."""

from __future__ import annotations

import os
import shutil
import signal

import pytest
from diag.analyzers import Finding, Fix

import diag
from diag.tui.app import TopApp
from diag.tui.source import LiveSource, ReplaySource
from diag.tui.widgets.findings import FindingsPanel
from diag.tui.widgets.screens import TextScreen
from diag.tui.widgets.table import SyncTable
from tests.tui.conftest import columns_fit, sync, wait_for
from tests.tui.synth import SynthJob


def _cell(app, table: str, row: str, col: str) -> str:
    return str(app.query_one(f"#{table}", SyncTable).get_cell(row, col))


@sync
async def test_replay_panels_show_the_trace_and_keys_work(real_trace):
    tr = diag.load(real_trace)
    steps = tr.steps.dropna(subset=["dur"]).sort_values("ts")
    app = TopApp(ReplaySource(real_trace, speed=0), analyze=None, interval=0.05)
    async with app.run_test(size=(150, 40)) as pilot:
        await wait_for(pilot, lambda: app.refreshes > 0)
        for rank in tr.ranks:
            last = steps[steps["rank"] == rank].iloc[-1]
            assert _cell(app, "ranks-table", str(rank), "step") == str(last["step"])
            assert _cell(app, "ranks-table", str(rank), "step ms") == f"{last['dur'] / 1e6:.1f}"
        layers = app.query_one("#layer-table", SyncTable)
        assert layers.row_count == len(app.view.layer_rows) > 0
        over = tr.overflow[tr.overflow["overflow"].astype(bool)]
        for step in over["step"].unique():
            ranks = ",".join(str(r) for r in sorted(over[over["step"] == step]["rank"].unique()))
            assert _cell(app, "overflow-table", str(step), "overflow on ranks") == ranks
        await pilot.press("s")  # sort by step ms, slowest first
        table = app.query_one("#ranks-table", SyncTable)
        first = str(table.get_row_at(0)[0])
        slowest = max(app.view.rank_rows, key=lambda r: r.step_ms or 0).rank
        assert first == str(slowest) and "sort: step ms" in str(app.query_one("#status").render())
        await pilot.press("r")
        assert str(table.get_row_at(0)[0]) != first
        await pilot.press("p")
        assert app.paused and "PAUSED" in str(app.query_one("#status").render())
        await pilot.press("p")
        await pilot.press("3")
        assert app.query_one("#panels").active == "layers"
        await pilot.press("n")
        assert app.query_one("#panels").active == "overflow"
        await pilot.press("1", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, TextScreen))
        assert "collectives of this rank" in str(app.screen.query_one("#screen-text").render())
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, TextScreen) and "keys" in app.screen.text
        await pilot.press("escape", "q")
    assert app.return_code == 0


@sync
async def test_findings_panel_shows_fixes_and_survives_failures(real_trace):
    def fake(trace):
        return [
            Finding(
                rule="loss-scale",
                severity="warning",
                title="loss scale collapsing",
                detail="halved twice",
                ranks=[0],
                fixes=[Fix("use bf16", ds_config={"bf16": {"enabled": True}})],
            )
        ], {}

    app = TopApp(ReplaySource(real_trace, speed=0), analyze=fake, interval=0.05)
    async with app.run_test(size=(150, 40)) as pilot:
        await wait_for(pilot, lambda: app.pump.analyses > 0)
        await pilot.press("6")
        await wait_for(pilot, lambda: "use bf16" in app.query_one(FindingsPanel).note)
        assert '"bf16": {"enabled": true}' in app.query_one(FindingsPanel).note

    def broken(trace):
        raise RuntimeError("rule exploded")

    app = TopApp(ReplaySource(real_trace, speed=0), analyze=broken, interval=0.05)
    async with app.run_test(size=(150, 40)) as pilot:
        await wait_for(pilot, lambda: app.pump.analyses > 0)
        await wait_for(pilot, lambda: "rule exploded" in app.query_one(FindingsPanel).note)
        assert app.refreshes > 0  # the rest of the UI kept working


@sync
async def test_real_analyzers_run_on_live_data(real_trace):
    from diag.tui.pump import run_analyzers

    app = TopApp(ReplaySource(real_trace, speed=0), analyze=run_analyzers, interval=0.05)
    async with app.run_test(size=(150, 40)) as pilot:
        await wait_for(pilot, lambda: app.pump.analyses > 0)
        panel = app.query_one(FindingsPanel)
        await wait_for(pilot, lambda: panel.note != "analyzers not run yet")
        assert "analyzers failed" not in panel.note


@pytest.mark.slow
@sync
async def test_live_two_rank_deepspeed_job(tmp_path):
    from tests.workloads import launch

    job = launch.popen(
        "tests.workloads.gpt_ds",
        ["--diag", "--trace-dir", str(tmp_path), "--steps", "40", "--step-sleep", "0.25"],
    )
    try:
        app = TopApp(LiveSource(str(tmp_path)), analyze=None, interval=0.2)
        async with app.run_test(size=(150, 40)) as pilot:

            def step_of(rank: int) -> int:
                rows = {r.rank: r for r in (app.view.rank_rows if app.view else [])}
                return rows[rank].step if rank in rows and rows[rank].step is not None else -1

            await wait_for(
                pilot, lambda: job.poll() is not None or min(step_of(0), step_of(1)) >= 2, tries=1200
            )
            assert job.poll() is None, job.stdout.read() if job.stdout else ""
            seen = step_of(0)
            await wait_for(pilot, lambda: step_of(0) >= seen + 2, tries=400)  # it follows the job
            assert _cell(app, "ranks-table", "1", "step") == str(step_of(1))
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=30)


@sync
async def test_256_ranks_update_cells_in_place(tmp_path):
    job = SynthJob(str(tmp_path), 256, slow_rank=7)
    job.write_step(0)
    app = TopApp(LiveSource(str(tmp_path)), analyze=None, interval=0.05)
    async with app.run_test(size=(150, 40)) as pilot:
        await wait_for(pilot, lambda: app.view is not None and app.view.last_step == 0)
        table = app.query_one("#ranks-table", SyncTable)
        assert table.row_count == 256 and "slow" in _cell(app, "ranks-table", "7", "health")
        for step in (1, 2):
            job.write_step(step)
            await wait_for(pilot, lambda s=step: app.view.last_step == s, tries=400)
        assert table.row_count == 256
        # each new step rewrites only the cells that changed (step, times, memory), never all 9
        assert 0 < table.cell_updates <= 2 * 256 * 6
    job.close()


@sync
async def test_gpu_panel_from_the_sidecar_file_and_no_gpu_note(tmp_path):
    from diag.cli.top import gpu_sidecar
    from diag.nvml.sidecar import Sidecar
    from tests.unit import fake_nvml

    SynthJob(str(tmp_path), 2).close()
    car = Sidecar(str(tmp_path), interval=3600, module=fake_nvml.make(), host="hostA")
    assert car.start()
    car.sample_once()
    car.stop()
    app = TopApp(LiveSource(str(tmp_path)), analyze=None, interval=0.05)
    async with app.run_test(size=(150, 40)) as pilot:
        await wait_for(pilot, lambda: app.query_one("#gpu-table", SyncTable).row_count == 2)
        gpu = diag.load(str(tmp_path)).gpu
        last = gpu[gpu["index"] == 0].iloc[-1]
        assert _cell(app, "gpu-table", "hostA:0", "util") == f"{last['util']}%"
        assert _cell(app, "gpu-table", "hostA:0", "throttle") == ",".join(last["throttle"])
        assert _cell(app, "gpu-table", "hostA:1", "ECC") == "-"  # not supported there
    empty = tmp_path / "empty"
    empty.mkdir()
    _, notes = gpu_sidecar(str(empty))
    if not notes:
        pytest.skip(reason="this machine has an NVIDIA GPU")
    app = TopApp(LiveSource(str(empty)), analyze=None, interval=0.05, notes=tuple(notes))
    async with app.run_test(size=(150, 40)) as pilot:
        await pilot.press("5")
        for widget in ("#status", "#gpu-note"):
            assert "no NVIDIA GPU (NVML not found)" in str(app.query_one(widget).render())


@sync
async def test_a_file_the_readers_refuse_gets_a_line(real_trace, tmp_path):
    """A FIFO named like a rank file: the readers refuse it (issue 10); top used to drop it silently."""
    shutil.copytree(real_trace, tmp_path / "t")
    os.mkfifo(tmp_path / "t" / "rank-00009.jsonl")
    for source in (ReplaySource(str(tmp_path / "t"), speed=0), LiveSource(str(tmp_path / "t"))):
        app = TopApp(source, analyze=None, interval=0.05)
        async with app.run_test(size=(200, 40)) as pilot:
            await wait_for(pilot, lambda app=app: app.refreshes > 0 and app.view.refused)
            status = str(app.query_one("#status").render())
            assert "rank-00009.jsonl: a FIFO, not a regular file: refused" in status, status
            assert app.view.ranks == len(diag.load(real_trace).ranks)  # the good files still shown


@sync
async def test_columns_widen_when_cells_outgrow_the_first_rows(tmp_path):
    """The first rows hold placeholders ("-"): a later, longer cell used to be cut to the width of
    the first rows (`408.7 MiB / 23.5 GiB (` with 90 columns unused)."""
    job = SynthJob(str(tmp_path), 2)
    for f in job.files:
        f.flush()  # headers only: every cell but rank and host is a placeholder
    app = TopApp(LiveSource(str(tmp_path)), analyze=None, interval=0.05)
    async with app.run_test(size=(200, 40)) as pilot:
        await wait_for(pilot, lambda: app.view is not None and app.view.ranks == 2)
        table = app.query_one("#ranks-table", SyncTable)
        assert _cell(app, "ranks-table", "0", "memory peak / capacity") == "-"
        job.write_step(0)
        await wait_for(pilot, lambda: app.view.last_step == 0)
        await wait_for(pilot, lambda: _cell(app, "ranks-table", "0", "memory peak / capacity") != "-")
        await wait_for(pilot, lambda: columns_fit(app, "ranks-table"))
        for col in ("memory peak / capacity", "last collective", "health"):
            text = max((_cell(app, "ranks-table", str(r), col) for r in (0, 1)), key=len)
            assert table.columns[col].get_render_width(table) >= len(text) + 2, (col, text)
        await pilot.press("q")
    job.close()


@sync
async def test_waits_for_a_trace_directory_that_does_not_exist_yet(tmp_path):
    later = tmp_path / "not-yet"
    app = TopApp(LiveSource(str(later), wait=True), analyze=None, interval=0.05)
    async with app.run_test(size=(150, 40)) as pilot:
        summary = str(app.query_one("#summary").render())
        assert "does not exist yet" in summary and "waiting for data" in summary, summary
        SynthJob(str(later), 2).write_step(0)  # the job starts and creates it
        await wait_for(pilot, lambda: app.view is not None and app.view.last_step == 0)
        assert "does not exist yet" not in str(app.query_one("#summary").render())


@sync
async def test_narrower_cells_do_not_remeasure_the_column(tmp_path, monkeypatch):
    """DataTable re-measures a whole column for each updated cell narrower than the column: at 1,024
    ranks a refresh (8 changing columns) was 8 million measurements and `bench.tui` never finished."""
    import textual.widgets._data_table as dt
    from textual.app import App

    class One(App[None]):
        def compose(self):
            yield SyncTable(("key", "value"), id="t")

    n = 300
    app = One()
    async with app.run_test(size=(80, 20)) as pilot:
        table = app.query_one("#t", SyncTable)
        table.sync({str(i): (str(i), "x" * 20) for i in range(n)})
        await pilot.pause()
        calls = []
        real = dt.measure
        monkeypatch.setattr(dt, "measure", lambda *a, **k: calls.append(1) or real(*a, **k))
        table.sync({str(i): (str(i), "y" * 5) for i in range(n)})  # every cell narrower
        await pilot.pause()
        assert len(calls) <= n, len(calls)  # was 3n: the whole column again per narrower cell
        table.sync({str(i): (str(i), "z" * 30 if i == 0 else "y" * 5) for i in range(n)})
        await pilot.pause()  # one cell wider than its column: the column widens
        assert table.columns["value"].get_render_width(table) >= 30 + 2
        assert table.row_count == n and str(table.get_cell("1", "value")) == "y" * 5
