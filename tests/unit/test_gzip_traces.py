"""A diag trace directory archived with `gzip rank-*.jsonl` reads as the plain one: the same report,
whole and windowed, detected by content (the gzip magic), a cut gzip stream keeping the records
before the cut as a cut plain file does, and `gzip -k`'s two copies of one file refused, not read
twice."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import zlib

import pytest

from diag.cli import main
from diag.metrics import windowed_stage
from diag.tui import tail
from diag.tui.source import ReplaySource
from tests.unit.windowing import diag_folders

SHAPES = ["healthy", "zero3", "fp16_overflow", "megatron_tp2", "hang_killed_early"]  # (the last: proc-)
FOLDERS = [d for d in diag_folders() if os.path.basename(d) in SHAPES]
HEALTHY = next(d for d in FOLDERS if d.endswith("healthy"))
HOW = {"whole": ["--no-windowed"], "windowed": ["--windowed", "--window-steps", "3"]}


def _gzipped(folder: str, to: str, keep: bool = False) -> str:
    """A copy of `folder` with its diag files gzipped as `gzip` does (`keep`: `gzip -k`)."""
    shutil.copytree(folder, to)
    for name in os.listdir(to):
        path = os.path.join(to, name)
        if name.endswith(".jsonl"):
            with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
                shutil.copyfileobj(f, g)
            if not keep:
                os.remove(path)
    return to


def _analyze(capsys, folder: str, how: str) -> tuple[int, dict, str]:
    rc = main(["analyze", "--json", *HOW[how], folder])
    out, err = capsys.readouterr()
    doc = json.loads(out) if out else {}
    doc.pop("sources", None)
    return rc, doc, err


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("folder", FOLDERS, ids=os.path.basename)
def test_a_gzipped_directory_gives_the_plain_ones_report(folder, how, capsys, tmp_path):
    plain = _analyze(capsys, folder, how)
    gz = _analyze(capsys, _gzipped(folder, str(tmp_path / "gz")), how)
    assert gz[:2] == plain[:2]
    assert gz[1]["ranks"]  # (not two empty reports)


def test_gzip_is_told_by_content_not_name(capsys, tmp_path):
    """A gzipped file named .jsonl reads the same (a renamed archive)."""
    d = _gzipped(HEALTHY, str(tmp_path / "t"))
    for name in os.listdir(d):
        if name.endswith(".jsonl.gz"):
            os.rename(os.path.join(d, name), os.path.join(d, name[:-3]))
    assert _analyze(capsys, d, "whole")[:2] == _analyze(capsys, HEALTHY, "whole")[:2]


def _cut(tmp_path) -> tuple[str, str, int]:
    """(a gzipped healthy copy whose rank 1 file is cut mid-stream, the plain copy cut where the
    decompressed bytes of that cut end, the records before the cut)."""
    gz = _gzipped(HEALTHY, str(tmp_path / "gz"))
    path = os.path.join(gz, "rank-00001.jsonl.gz")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[: len(data) // 2])
    plain = str(tmp_path / "plain")
    shutil.copytree(HEALTHY, plain)
    with open(os.path.join(plain, "rank-00001.jsonl"), "wb") as f:
        f.write(head)  # (its last line cut as the stream is: "truncated", a killed writer's file)
    assert not head.endswith(b"\n")
    return gz, plain, head.count(b"\n") - 1  # (the header is no event)


@pytest.mark.parametrize("how", HOW)
def test_a_cut_gzip_keeps_what_came_before_the_cut(how, capsys, tmp_path):
    gz, plain, events = _cut(tmp_path)
    rc_gz, doc_gz, _ = _analyze(capsys, gz, how)
    rc_plain, doc_plain, _ = _analyze(capsys, plain, how)
    assert rc_gz == rc_plain == 2  # (a problem: exit 2, as for the cut plain file)
    [gz_problem], [plain_problem] = doc_gz.pop("problems"), doc_plain.pop("problems")
    assert "truncated or corrupt gzip" in gz_problem["message"]
    assert f"after {events} events" in gz_problem["message"]
    assert f"truncated after {events} events" in plain_problem["message"]
    assert doc_gz == doc_plain


def test_a_broken_gzip_file_is_one_line_not_a_traceback(capsys, tmp_path):
    d = _gzipped(HEALTHY, str(tmp_path / "t"))
    with open(os.path.join(d, "rank-00001.jsonl.gz"), "wb") as f:
        f.write(gzip.compress(b"")[:10] + b"not deflate at all")
    for how in HOW:
        rc, doc, err = _analyze(capsys, d, how)
        assert rc == 2 and doc["ranks"] == [0]  # (rank 1 unread, rank 0 as ever)
        [problem] = doc["problems"]
        assert problem["message"].startswith(f"{d}/rank-00001.jsonl.gz: truncated or corrupt gzip")
        assert "Traceback" not in err


@pytest.mark.parametrize("how", HOW)
def test_gzip_k_twins_are_refused_in_one_line(how, capsys, tmp_path):
    d = _gzipped(HEALTHY, str(tmp_path / "t"), keep=True)
    rc, doc, err = _analyze(capsys, d, how)
    assert rc == 2 and not doc
    assert err.strip().splitlines()[-1] == (
        f"diag analyze: error: {d}: holds rank-00000.jsonl and rank-00000.jsonl.gz, "
        "one file plain and gzipped (gzip -k?): move one of them out of the directory"
    )


def _replayed(folder: str) -> tuple[list, list]:
    source = ReplaySource(folder, speed=0)
    chunks = source.poll()
    events = sorted(
        (os.path.basename(c.path).removesuffix(".gz"), json.dumps(e, sort_keys=True))
        for c in chunks
        for e in c.events
    )
    return events, [(os.path.basename(c.path), c.problem) for c in chunks if c.problem]


def test_the_tail_reads_a_gzipped_file_as_a_finished_one(tmp_path, monkeypatch):
    monkeypatch.setattr(tail, "MAX_READ", 4096)  # several polls a file
    plain, _ = _replayed(HEALTHY)
    assert _replayed(_gzipped(HEALTHY, str(tmp_path / "gz"))) == (plain, [])
    follower = tail.DirTail(str(tmp_path / "gz"))
    while follower.poll():
        pass
    assert all(t.finished and t.stream is None for t in follower.files.values())  # (closed)


def test_the_tail_keeps_what_came_before_a_cut_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(tail, "MAX_READ", 4096)
    gz, plain, _ = _cut(tmp_path)
    events, problems = _replayed(gz)
    assert events == _replayed(plain)[0]
    assert [(name, why.split(" (")[0]) for name, why in problems] == [
        ("rank-00001.jsonl.gz", "truncated or corrupt gzip")
    ]


def test_the_tail_leaves_a_gzip_k_twin_out_and_says_so(tmp_path):
    d = _gzipped(HEALTHY, str(tmp_path / "t"), keep=True)
    follower = tail.DirTail(d)
    chunks = follower.poll()
    assert {os.path.basename(c.path): c.problem for c in chunks if c.problem} == {
        f"rank-0000{r}.jsonl.gz": "left out: one file plain and gzipped (gzip -k?)" for r in (0, 1)
    }
    assert not any(c.events for c in chunks if c.path.endswith(".gz"))


def test_input_bytes_counts_a_gzipped_file_uncompressed(tmp_path):
    """`--windowed`'s default choice reads the bytes a file holds, not its size on disk."""
    plain = windowed_stage.input_bytes(HEALTHY)
    gz = _gzipped(HEALTHY, str(tmp_path / "gz"))
    on_disk = sum(os.path.getsize(os.path.join(gz, f)) for f in os.listdir(gz) if f.startswith("rank-"))
    assert plain and on_disk < plain / 3  # (what the files' sizes said before)
    assert 0.8 * plain <= windowed_stage.input_bytes(gz) <= 1.25 * plain


def test_a_gzipped_file_of_a_rank_not_asked_for_is_not_opened(capsys, tmp_path):
    """`--ranks` skips a rank-NNNNN.jsonl.gz by its name, as it skips a rank-NNNNN.jsonl."""
    d = _gzipped(HEALTHY, str(tmp_path / "t"))
    with open(os.path.join(d, "rank-00001.jsonl.gz"), "wb") as f:
        f.write(b"\x1f\x8b unreadable: an error if opened")
    for how in HOW:
        rc = main(["analyze", "--json", "--ranks", "0", *HOW[how], d])
        assert rc == 0 and json.loads(capsys.readouterr().out)["problems"] == []


def test_a_gzipped_later_capture_is_a_capture(capsys, tmp_path):
    """`rank-N.K.jsonl.gz` is capture K, as `rank-N.K.jsonl` is: refused unnamed, not merged."""
    d = _gzipped(HEALTHY, str(tmp_path / "t"))
    shutil.copy(os.path.join(d, "rank-00000.jsonl.gz"), os.path.join(d, "rank-00000.1.jsonl.gz"))
    assert main(["analyze", "--json", d]) == 2
    assert "2 captures in" in capsys.readouterr().err
    assert main(["analyze", "--json", "--each-run", d]) == 0


def test_workers_plan_a_gzipped_file_by_its_uncompressed_size(tmp_path, monkeypatch):
    """Whether to fork readers is asked of the bytes to parse: the gz copy plans as the plain."""
    from diag.trace import workers

    monkeypatch.delenv("DIAG_WORKERS", raising=False)
    gz = _gzipped(HEALTHY, str(tmp_path / "gz"))
    plain = sorted(os.path.join(HEALTHY, f) for f in os.listdir(HEALTHY) if f.startswith("rank-"))
    least = int(0.8 * sum(os.path.getsize(f) for f in plain))
    gzipped = sorted(os.path.join(gz, f) for f in os.listdir(gz) if f.startswith("rank-"))
    assert workers.workers_for(gzipped, least, 1, 0) == workers.workers_for(plain, least, 1, 0) >= 1
