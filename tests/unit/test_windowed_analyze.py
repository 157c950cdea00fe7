"""`diag analyze --windowed`: a diag trace read a window of steps at a time, never its calls whole
(issue 14, `diag.metrics.windowed_stage`), gives the whole read's report but for what it says it
did not do: the rules not yet reduced (`windowed.not_run`, each in `rule_failures` with why) and the
sections made without the call and layer records (`windowed.partial`)."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil

import pytest

from bench.windowed_doc import without_what_was_not_done
from diag.cli import main
from diag.metrics import windowed_stage
from diag.metrics.withheld import WholeOnly
from tests.unit.windowing import diag_folders

# one of each shape (the 29 folders: /tmp/s19/wcmp.py in the closing note of session 19)
SHAPES = ["healthy", "zero3", "megatron_tp2", "hang_killed_early", "pp2_starved", "repro_tiny_collectives"]
SHAPES += ["fp16_overflow", "straggler", "repro_memory_near_capacity", "straggler_onset"]
# (straggler_onset: its rule keeps a table per `Metrics`; made of a learning run's empty answers, it
# hid the finding until each run got a `Metrics` of its own)
FOLDERS = [d for d in diag_folders() if os.path.basename(d) in SHAPES]


def _analyze(capsys, *args: str) -> tuple[int, dict, str]:
    rc = main(["analyze", "--json", *args])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


@pytest.mark.parametrize("folder", FOLDERS, ids=os.path.basename)
def test_windowed_equals_whole_but_for_what_it_says(folder, capsys):
    rc_whole, whole, _ = _analyze(capsys, "--no-windowed", folder)
    rc, windowed, err = _analyze(capsys, "--windowed", "--window-steps", "3", folder)
    assert rc == rc_whole
    assert "windowed" in windowed and "windowed" not in whole
    # every rule and section reads the calls and layers through reductions: nothing left out
    assert windowed["windowed"] == {"not_run": [], "partial": []}
    # the figures and the early reductions, then the others (a rule's follow-up: one more)
    assert re.search(r"3 steps at a time in [23] pass\(es\)", err)
    without_what_was_not_done(whole, windowed)
    assert windowed == whole


def test_a_finding_of_a_reduced_rule_is_found_windowed(capsys):
    """Not only empty reports agree: the tiny-collectives finding comes out of the later pass."""
    folder = next(d for d in FOLDERS if d.endswith("repro_tiny_collectives"))
    _, doc, err = _analyze(capsys, "--windowed", "--window-steps", "2", folder)
    assert [f["rule"] for f in doc["findings"]].count("tiny_collectives") == 1
    assert "in 2 pass(es)" in err  # the figures and the early reductions, then the others


def test_the_withheld_records_raise_where_read(capsys):
    stage = windowed_stage.read(next(d for d in FOLDERS if d.endswith("healthy")))
    for read in (
        lambda: stage.trace.comms,
        lambda: stage.trace.layers,
        lambda: stage.trace.frames.get("comm"),
        lambda: stage.trace.frames["layer"],
        lambda: stage.comms,
        lambda: stage.placement,
    ):
        with pytest.raises(WholeOnly):
            read()
    assert len(stage.trace.steps) and len(stage.trace.memory)  # held whole
    assert "comm" not in dict(stage.trace.frames)


def test_by_default_a_small_trace_is_read_whole_and_out_of_step_files_whole(capsys, tmp_path):
    folder = next(d for d in FOLDERS if d.endswith("healthy"))
    _, doc, err = _analyze(capsys, folder)
    assert "windowed" not in doc and "steps at a time" not in err
    # a writer's comm line of no step: the lock-step reader cannot place it (`OutOfStep`)
    shutil.copytree(folder, tmp_path / "t")
    with open(tmp_path / "t" / "rank-00001.jsonl", "a") as f:
        f.write('{"k":"comm","op":"barrier","ts":9}\n')
    with pytest.raises(windowed_stage.NotWindowed):
        windowed_stage.read(str(tmp_path / "t"))
    _, doc, err = _analyze(capsys, "--windowed", str(tmp_path / "t"))
    assert "reading the trace whole, not a window at a time" in err and "windowed" not in doc


def test_a_reader_of_every_call_is_reported_not_run_never_run_on_part(capsys, monkeypatch, tmp_path):
    """A rule or report section that reads the calls outside a reduction: the rule is reported not
    run (why, in every renderer), the section made without them and named partial."""
    from diag.analyzers import base

    from diag.report import trace_doc

    def reads_calls(trace, metrics):
        assert len(trace.comms) >= 0
        return []

    base.registered_rules()
    monkeypatch.setitem(base._RULES, "reads_calls", (reads_calls, "test"))
    monkeypatch.setattr(trace_doc, "step_timeline", lambda trace: trace.layers.head(0))
    folder = next(d for d in FOLDERS if d.endswith("healthy"))
    md = tmp_path / "r.md"
    _, doc, err = _analyze(capsys, "--windowed", "--markdown", str(md), folder)
    assert doc["windowed"] == {"not_run": ["reads_calls"], "partial": ["step_timeline"]}
    assert doc["rule_failures"]["reads_calls"].startswith(
        "not run under the windowed pass: it reads every call"
    )
    assert "not run (they read every call or layer record): reads_calls" in err
    text = md.read_text()
    assert "rule `reads_calls`: not run under the windowed pass" in text and "failed" not in text
    assert "as if none were recorded: step_timeline" in text


@pytest.mark.parametrize("name", ["zero3", "megatron_tp2"])
def test_calls_that_omit_their_groups_ranks_read_as_written_whole(name, tmp_path, capsys, monkeypatch):
    """The agent writes a large group's ranks on its first call of a step only (`comm_line`).
    The folder's calls rewritten so (every group taken as large): the whole read, the windowed
    pass (a window a step) and the live tail fill them, and the report is the folder's own."""
    from diag import schema
    from diag.trace import comm_line
    from diag.tui.tail import DirTail

    folder = next(d for d in diag_folders() if os.path.basename(d) == name)
    monkeypatch.setattr(comm_line, "ALWAYS", 0)
    monkeypatch.setattr(comm_line, "_PLANS", {})
    omitted = 0
    for path in sorted(os.listdir(folder)):
        comm_line.new_file()
        with open(os.path.join(folder, path)) as f, open(tmp_path / path, "w") as out:
            for line in f:
                if line.startswith('{"k":"comm",'):
                    rec = json.loads(line)
                    call = [rec[k] for k in schema._KEYS[schema.COMM]]  # (its kind first)
                    call[7] = tuple(call[7])
                    new = comm_line.comm_text(tuple(call), rec["dur"], 0)
                    assert new is not None and {**json.loads(new), "group_ranks": rec["group_ranks"]} == rec
                    omitted += '"group_ranks"' not in new
                    line = new + "\n"
                out.write(line)
    assert omitted > 100
    for how in (["--no-windowed"], ["--windowed", "--window-steps", "1"]):
        _, want, _ = _analyze(capsys, *how, folder)
        _, got, _ = _analyze(capsys, *how, str(tmp_path))
        assert json.loads(json.dumps(got).replace(str(tmp_path), folder)) == want
    tail = DirTail(str(tmp_path))
    calls = [e for c in tail.poll() for e in c.events if e["k"] == schema.COMM]
    assert calls and all(isinstance(e["group_ranks"], list) for e in calls)


@pytest.mark.parametrize(
    "name, steps", [("zero3", 2), ("megatron_tp2", 2), ("hang_killed_early", 30), ("straggler", 2)]
)
def test_workers_give_the_report_read_in_process(name, steps, capsys, monkeypatch):
    """The windows read in forked workers (`trace.shards`: every pass of the windowed reading, a
    trace of 32 MiB or more on 2 cores or more) give the document read in this process. (Six
    windows of the 179-step hang: at 2 steps, 90 windows' fixed cost took a minute.)"""
    from diag.trace import shards

    folder = next(d for d in FOLDERS if os.path.basename(d) == name)
    args = ("--windowed", "--window-steps", str(steps), folder)
    monkeypatch.setattr(shards, "workers_for", lambda files: 0)
    rc, alone, err = _analyze(capsys, *args)
    monkeypatch.setattr(shards, "workers_for", lambda files: 2)
    assert _analyze(capsys, *args) == (rc, alone, err)
    monkeypatch.setattr(shards, "workers_for", lambda files: 1)
    monkeypatch.setattr(shards, "CHUNK_RECORDS", 1)  # each file's window made frames on its own
    assert _analyze(capsys, *args) == (rc, alone, err)


def test_a_window_holds_about_the_same_records_whatever_a_step_writes(tmp_path):
    """`steps_for`: ~`WINDOW_RECORDS` records a window, counted a rank-step at the first file's
    start: the ZeRO-3 sample's 71 a rank-step as before (256 rank-steps), a DDP job's 3 (a window
    of 256 rank-steps cost it a fixed ~0.1 s each: 5x the whole read), 71 where no step is seen."""
    zero3 = os.path.join(os.path.dirname(FOLDERS[0]), "zero3")
    files = sorted(glob.glob(os.path.join(zero3, "rank-*.jsonl")))
    assert windowed_stage.steps_for(files) == windowed_stage.RANK_STEPS // len(files)
    step = ['{"k":"step","step":%d}', '{"k":"comm","step":%d}', '{"k":"layer","step":%d}']
    ddp = [tmp_path / f"rank-{r:05d}.jsonl" for r in range(4)]
    for f in ddp:
        f.write_text('{"k":"header"}\n' + "".join(line % s + "\n" for s in range(9_000) for line in step))
    assert windowed_stage.steps_for([str(f) for f in ddp]) == windowed_stage.WINDOW_RECORDS // 12
    ddp[0].write_text('{"k":"header"}\n' + '{"k":"comm","step":0}\n' * 100)
    assert windowed_stage.steps_for([str(f) for f in ddp]) == windowed_stage.RANK_STEPS // 4
