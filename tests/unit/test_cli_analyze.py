"""`diag analyze` as users run it (a subprocess): reports, and one-line errors for malformed inputs
(exit 2, no traceback) while the readable ranks are still analyzed."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess

import pytest

from tests.unit.kineto_samples import CPU_RANKS, GPT_DS
from tests.workloads import launch


def _diag(*args: str) -> subprocess.CompletedProcess[str]:
    return launch.diag_cli("analyze", *args)


def _truncated_gzip(path):
    with open(CPU_RANKS[0], "rb") as f:
        data = f.read()
    path.write_bytes(data[: len(data) // 2])


def _missing_fields(path):
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 5}}))


BAD = {
    "truncated.json.gz": (_truncated_gzip, "truncated or corrupt gzip"),
    "invalid.json": (lambda p: p.write_text('{"traceEvents": [{"ph": "X",'), "invalid JSON"),
    "missing.json": (_missing_fields, "no traceEvents list"),
    "binary.log": (lambda p: p.write_bytes(bytes(range(256)) * 8), "binary file"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_file_is_one_line_and_other_ranks_analyzed(tmp_path, name):
    for p in CPU_RANKS:
        shutil.copy(p, tmp_path)
    make, reason = BAD[name]
    make(tmp_path / name)
    r = _diag(str(tmp_path), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and reason in lines[0], r.stderr
    assert json.loads(r.stdout)["ranks"] == [0, 1]


def test_empty_directory_and_event_fields_missing(tmp_path):
    (tmp_path / "empty").mkdir()
    sparse = tmp_path / "sparse.json"  # events without ts/dur/args: imported, not a crash
    sparse.write_text(
        json.dumps(
            {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm"}, {"ph": "X", "cat": "kernel"}]}
        )
    )
    r = _diag(str(tmp_path / "empty"), str(sparse), CPU_RANKS[1], "-q")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"diag analyze: error: {tmp_path / 'empty'}: empty directory: no traces or logs in it"
    ]
    assert "2 ranks" in r.stdout


def test_nothing_readable_and_unknown_rule(tmp_path):
    bad = tmp_path / "x.json.gz"
    bad.write_bytes(gzip.compress(b"not json"))
    r = _diag(str(bad))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "invalid JSON" in r.stderr
    r = _diag(CPU_RANKS[0], "--rules", "no_such_rule")
    assert r.returncode == 2 and "unknown rule" in r.stderr and "Traceback" not in r.stderr


def test_trace_plus_log_writes_all_reports(tmp_path):
    md, html = tmp_path / "r.md", tmp_path / "r.html"
    r = _diag(GPT_DS, "--markdown", str(md), "--html", str(html), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "diag.analyze" and doc["version"] == 2
    assert doc["ranks"] == [0, 1] and doc["summary"]["overflows"] == 2
    assert [x["loss_scale"] for x in doc["metrics"]["loss_scale"]] == [256.0, 128.0, 64.0]
    assert {c["op"] for c in doc["metrics"]["collectives"]} == {"all_reduce"}
    # one group, and that one diag's placeholder (a trace with no group names): no group said
    assert "| rank | op | calls |" in md.read_text() and "| all_reduce |" in md.read_text()
    assert "Collectives (time" in md.read_text()
    assert html.read_text().count("<svg") == 7  # 6 plots and the per-rank step timeline


def test_diag_trace_dir_with_its_log(tmp_path, capsys):
    from diag import agent, schema
    from diag.cli import main

    ag = agent.start(str(tmp_path / "t"), what=("steps",))
    t0 = ag.now()
    for step in range(3):
        ag.emit((schema.STEP, step, t0 + step * 10_000_000, 9_000_000, 8, None, True))
        ag.emit(
            (
                schema.COMM,
                step,
                "all_reduce",
                8 << 20,
                "float32",
                "dp",
                2,
                [0, 1],
                t0 + step * 10_000_000 + 1_000_000,
                4_000_000,
                None,
                False,
            )
        )
    agent.stop()
    log = tmp_path / "train.log"
    log.write_text(
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512\n"
    )
    assert main(["analyze", str(tmp_path / "t"), str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["steps"]["count"] == 3 and doc["summary"]["overflows"] == 1
    (coll,) = doc["metrics"]["collectives"]
    assert coll["calls"] == 3 and coll["algbw"] == (8 << 20) / 4_000_000
    assert len(doc["sources"]) == 2


def test_options_between_paths(tmp_path):
    """`diag analyze TRACE -q LOG`: the log after an option is an input, as users type it (argparse
    alone refused it: 'unrecognized arguments')."""
    log = tmp_path / "train.log"
    log.write_text(
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512\n"
    )
    r = _diag(GPT_DS, "--json", str(log))
    assert r.returncode == 0, r.stderr
    plain = _diag(GPT_DS, str(log), "--json")
    sources = json.loads(plain.stdout)["sources"]
    assert str(log) in json.dumps(sources) and json.loads(r.stdout)["sources"] == sources
    r = _diag(GPT_DS, "--rules", "overflow_storm", str(log), "--json")  # an option with a value between
    assert r.returncode == 0 and json.loads(r.stdout)["sources"] == sources, r.stderr


@pytest.mark.parametrize(
    ("sample", "header", "title"),
    [
        ("embedding_moved", "| rank | op | calls |", "Collectives in group world:1 ("),  # one group
        ("embedding_heavy", "| rank | op [group] | calls |", "Collectives ("),  # groups 0 and 1
    ],
)
def test_collectives_table_names_groups_once_or_per_row(tmp_path, sample, header, title):
    """The table splits each op by group; where the trace holds one group it is said once, in the
    title (a group beside every op wrapped every row of the demo's table at 80 columns)."""
    from tests.workloads.launch import ROOT

    md = tmp_path / "r.md"
    r = _diag(f"{ROOT}/sample_traces/{sample}", "--markdown", str(md))
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert header in text and title in text, text
    assert ("all_reduce [" in text) == (header.endswith("[group] | calls |"))
