"""A hang read after the job from the watcher's looks kept in its trace directory.

The fixture is the fault matrix's DDP hang cell (a real 2-rank run, rank 1 SIGSTOPped by the harness,
`diag watch` following), cut 3.5 s after the stop, as if the job had been killed then: too soon for
the heartbeat premise (3 missed beats of 2 s), so only the watcher's looks (`proc-vm.jsonl`: rank 1
stopped, state T, until the end; rank 0 sleeping in its all-reduce) say which rank hung. The job
printed iteration 429 last."""

from __future__ import annotations

import os
import shutil

from diag.analyzers import run_all

from diag.importers import load_inputs
from tests.conftest import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "hang_killed_early")


def _hangs(path: str) -> list:
    findings, failures = run_all(load_inputs([path]))
    assert failures == {}
    return [f for f in findings if f.severity in ("warning", "critical")]


def test_the_watchers_looks_name_the_rank_that_hung_after_the_job():
    (f,) = _hangs(FIXTURE)
    assert f.rule == "hang_desync" and f.ranks == [1] and f.steps == [430]
    assert "wait in all_reduce in group world:0" in f.title


def test_without_the_looks_the_trace_alone_says_nothing_yet(tmp_path):
    for name in os.listdir(FIXTURE):
        if not name.startswith("proc-"):
            shutil.copy(os.path.join(FIXTURE, name), tmp_path / name)
    assert _hangs(str(tmp_path)) == []
