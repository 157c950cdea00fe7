"""A process that ran without a rank (`diag run -- python train.py`, no launcher) reads `pid N` in
every rank column: the reader keys it by minus its pid, and the report, `--json` and `diag top`
printed that key as it is ("-20267" in the Throughput, Step time, Steps and Memory tables)."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

import diag
from diag.ranks import rank_label, rank_list, rank_name
from diag.tui import rows
from diag.tui.detail import rank_detail
from diag.tui.model import JobModel
from diag.tui.source import ReplaySource
from diag.tui.view import build_view
from tests.conftest import ROOT
from tests.workloads import launch

TRAIN = """import torch
m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(6):
    m(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(scope="module")
def lone(tmp_path_factory) -> tuple[str, int]:
    """A real single-process run under `diag run` (no launcher, so no rank): (trace dir, its pid)."""
    folder = tmp_path_factory.mktemp("lone")
    (folder / "train.py").write_text(TRAIN)
    trace = folder / "trace"
    proc = launch.diag_cli("run", "--trace-dir", str(trace), "--", sys.executable, str(folder / "train.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (header,) = diag.load(str(trace)).headers.values()
    assert header.get("rank") is None and isinstance(header["pid"], int)
    return str(trace), header["pid"]


def test_labels_of_ranks_pids_and_none() -> None:
    assert [rank_label(r) for r in (0, 7, -20267, -1, None, float("nan"))] == [
        "0",
        "7",
        "pid 20267",
        "-",
        "-",
        "-",
    ]
    assert [rank_name(r) for r in (3, -20267, -1)] == ["rank 3", "pid 20267", "no rank"]
    assert rank_list([0, -20267]) == "0,pid 20267" and rank_list([]) == "-"


def test_analyze_names_the_process_by_its_pid_in_every_table(lone, tmp_path) -> None:
    trace, pid = lone
    md, page = tmp_path / "report.md", tmp_path / "report.html"
    out = launch.diag_cli(
        "analyze", trace, "--markdown", str(md), "--html", str(page), env={"COLUMNS": "200"}
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for text in (out.stdout, md.read_text(), page.read_text()):
        assert not re.search(rf"-{pid}\b", text) and f"pid {pid}" in text
    titles = ("Throughput per rank", "Step time per rank", "Steps", "Memory per rank")
    for title in titles:
        table = out.stdout.split(title, 1)[1]
        first_row = next(ln for ln in table.splitlines() if ln.startswith("│"))
        assert f"pid {pid}" in first_row, (title, table[:600])


def test_json_keeps_the_rank_key_and_says_how_it_reads(lone) -> None:
    trace, pid = lone
    out = launch.diag_cli("analyze", trace, "--json")
    doc = json.loads(out.stdout)
    assert doc["ranks"] == [-pid] and doc["memory"]["peaks"][0]["rank"] == -pid  # the key is stable
    assert doc["rank_labels"] == {str(-pid): f"pid {pid}"}


def test_top_shows_the_pid_in_the_ranks_table_and_drill_in(lone) -> None:
    trace, pid = lone
    m = JobModel()
    m.ingest(ReplaySource(trace, speed=0).poll())
    table = rows.rank_rows(build_view(m))
    assert list(table) == [f"pid {pid}"] and table[f"pid {pid}"][0] == f"pid {pid}"
    detail = rank_detail(m, -pid)
    assert detail.startswith(f"pid {pid} on ") and str(-pid) not in detail


def test_top_app_drills_into_a_process_without_a_rank(lone) -> None:
    """The ranks table's row key is the label: enter on `pid N` opens that process's page."""
    import asyncio

    from diag.tui.app import TopApp
    from diag.tui.widgets.screens import TextScreen
    from diag.tui.widgets.table import SyncTable
    from tests.tui.conftest import wait_for

    trace, pid = lone
    app = TopApp(ReplaySource(trace, speed=0), analyze=None, interval=0.05)

    async def drive() -> None:
        async with app.run_test(size=(150, 30)) as pilot:
            await wait_for(pilot, lambda: app.view is not None and len(app.view.rank_rows) == 1)
            table = app.query_one("#ranks-table", SyncTable)
            await wait_for(pilot, lambda: table.row_count == 1)
            assert str(table.get_row_at(0)[0]) == f"pid {pid}"
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, TextScreen))
            assert app.screen.title_text == f"pid {pid}" and app.screen.text.startswith(f"pid {pid} on ")
            await pilot.press("escape", "q")

    asyncio.run(drive())


LATE_AND_CRASHING = """import time, torch
m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(12):
    time.sleep(0.03)  # the input pipeline is late on every step
    m(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
raise RuntimeError("planted")
"""


def test_findings_name_a_process_without_a_rank_by_its_pid(tmp_path) -> None:
    """The rules' titles and details printed the reader's key ("rank -20267", "Rank -20267 raised
    first"): a process that ran without a rank reads `pid N` there too, and the summary says what it is."""
    (tmp_path / "train.py").write_text(LATE_AND_CRASHING)
    trace = tmp_path / "trace"
    args = ("run", "--trace-dir", str(trace), "--layers-every", "1", "--", sys.executable)
    launch.diag_cli(*args, str(tmp_path / "train.py"))
    (header,) = diag.load(str(trace)).headers.values()
    pid = header["pid"]
    out = launch.diag_cli("analyze", str(trace), "--json")
    doc = json.loads(out.stdout)
    rules = {f["rule"]: f for f in doc["findings"]}
    assert {"idle_between_steps", "job_crash"} <= set(rules), sorted(rules)
    for f in rules.values():
        text = " ".join([f["title"], f["detail"], *(x.get("text", "") for x in f.get("fixes", []))])
        assert str(-pid) not in text and f"pid {pid}" in text, text
    assert f"pid {pid} raised" not in rules["job_crash"]["detail"]  # alone: nobody raised "first"
    plain = launch.diag_cli("analyze", str(trace), env={"COLUMNS": "200"})
    assert "0 ranks" not in plain.stdout and "1 process without a rank" in plain.stdout


def test_evidence_keys_read_as_ranks() -> None:
    """A finding's per-rank evidence printed the reader's key: `skipped_by_rank={-1: 20}` for a log
    with no rank (its JSON `{"-1": 20}`); it reads as every report reads a rank."""
    from diag.report.human import evidence_line

    ev = {"skipped_by_rank": {-1: 20}, "exposed_s": {"-20267": 0.5, "3": 0.25}, "by_op": {"all_reduce": 4}}
    assert (
        evidence_line(ev)
        == "skipped_by_rank={no rank: 20}, exposed_s={pid 20267: 500 ms, 3: 250 ms}, by_op={all_reduce: 4}"
    )


def test_log_without_ranks_prints_no_reader_key() -> None:
    """The real log of a DeepSpeed fp16 job whose lines name no rank, as `diag analyze` prints it."""
    log = os.path.join(ROOT, "tests", "fixtures", "logs", "ds_fp16_every_rank_overflow.log")
    plain = launch.diag_cli("analyze", log, env={"COLUMNS": "400"})
    assert plain.returncode == 0, plain.stderr[-2000:]
    (line,) = [ln for ln in plain.stdout.splitlines() if "skipped_by_rank" in ln]
    assert "skipped_by_rank={no rank: 20}" in line, line
