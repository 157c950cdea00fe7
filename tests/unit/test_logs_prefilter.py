"""The fast log reading (`logs.prefilter`: binary chunks, keyword prefilter, remembered prefix parses; and
`logs.many`: several logs in worker processes, steps merged as they come) reads exactly what offering
every line to the readers reads, on every fixture and on the awkward cases of a real file."""

from __future__ import annotations

import glob
import gzip
import os

import pandas as pd
import pytest

from diag.importers.errors import ImportProblem
from diag.importers.logs import import_log, merge_parts, prefilter
from diag.importers.logs.lines import Line, peel
from diag.importers.logs.many import import_logs

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIX = os.path.join(ROOT, "tests", "fixtures", "logs")
LOGS = sorted(
    glob.glob(os.path.join(FIX, "*.log"))
    + glob.glob(os.path.join(FIX, "*.md"))
    + glob.glob(os.path.join(FIX, "*.rst"))
    + glob.glob(os.path.join(ROOT, "sample_traces", "*", "*.log"))
)


def _same(path: str) -> None:
    def read(every: bool):
        try:
            return import_log(path, every_line=every)
        except ImportProblem as e:
            return str(e)

    fast, every = read(False), read(True)
    if isinstance(every, str) or isinstance(fast, str):
        assert fast == every
        return
    assert fast.ranks == every.ranks
    assert fast.headers == every.headers
    assert [(p.path, p.message) for p in fast.problems] == [(p.path, p.message) for p in every.problems]
    assert fast.frames.keys() == every.frames.keys()
    for kind in every.frames:
        pd.testing.assert_frame_equal(fast.frames[kind], every.frames[kind])


def test_there_are_fixtures():
    assert len(LOGS) >= 20


@pytest.mark.parametrize("path", LOGS, ids=os.path.basename)
def test_the_prefilter_reads_what_every_line_reads(path):
    _same(path)


def _awkward(tmp_path) -> str:
    """Every fixture's lines in one file, with what real files do to them: CRLF endings, a progress bar
    rewritten with `\\r`, bytes that are no UTF-8, a blank and a tab in the launcher prefixes, a line
    past the line limit, and no newline at the end."""
    lines = []
    for k, path in enumerate(LOGS):
        for i, ln in enumerate(open(path, encoding="utf-8").read().splitlines()):
            if k % 3 == 1:
                ln = f"worker-{k}: [rank{i % 4}]:\t{ln}"
            elif k % 3 == 2:
                ln = f"{i % 5}: {ln}"
            lines.append(ln.encode())
    lines[5] += b"\r\n"
    lines[40] = (
        b"  5%|5         | 1/20 [00:01<00:19,  1.00s/it]\r 10%|#         | 2/20 [00:02<00:18,  1.00s/it]"
    )
    lines[41] = b"[rank1]: bad \xff\xfe bytes iteration 3/ 10 | lm loss: 2.0 |"
    lines[60] = b"[rank7]: " + b"x" * 3000 + b" iteration"
    data = b"\n".join(lines)
    path = tmp_path / "awkward.log"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("chunk", [64, 1000, prefilter.CHUNK])
def test_awkward_lines_and_chunk_edges_read_the_same(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(prefilter, "CHUNK", chunk)
    monkeypatch.setenv("DIAG_MAX_LINE_BYTES", "2000")  # line 61 is past it: dropped by both
    path = _awkward(tmp_path)
    _same(path)
    gz = tmp_path / "awkward.log.gz"
    gz.write_bytes(gzip.compress(open(path, "rb").read()))
    _same(str(gz))


def test_ranks_named_only_by_lines_no_reader_reads_are_counted(tmp_path):
    path = tmp_path / "chatter.log"
    path.write_bytes(
        b"worker-9:  7:  [rank5]: chatter\n"  # three prefixes: the head holds three tokens
        b"  node-3: [default1]:[rank6]:\tchatter\n"
        b"noise\rworker-8: [rank7]: chatter\n"  # a `\r` piece has a head of its own
        b" iteration 10/ 100 | lm loss: 2.0 |\n"
    )
    _same(str(path))
    got = import_log(str(path))
    assert {r: h.get("host") for r, h in got.headers.items()} == {5: "worker-9", 6: "node-3", 7: "worker-8"}


def test_a_remembered_prefix_parse_is_the_parse(tmp_path):
    """`Line` parses each distinct line head once; the parse of the whole line agrees on every line."""
    raws = [ln for p in LOGS for ln in open(p, encoding="utf-8").read().splitlines() if ln]
    raws += [
        "worker-1: [default0]:[rank8]: iteration 1/ 2 |",
        "worker-1:\u00a0[rank8]: x",
        "3:  [rank2]: 10.0.0.1: a",
        "node-12:x: y",
        "[default3]:[Rank 5] step=1, skipped=0",
        "  \t[rank4]:\tTraceback (most recent call last):",
    ]
    for raw in raws:
        ln = Line(raw, 1)
        rank, host, end = peel(raw)
        assert (ln.host, ln.text) == (host, raw[end:]), raw
        assert ln.rank == rank or (rank < 0 and "[Rank" in ln.text), raw


def _merged(paths: list[str]) -> pd.DataFrame:
    parts: dict[str, list[pd.DataFrame]] = {}
    for _, got in paths:
        if not isinstance(got, ImportProblem):
            for kind, df in got.frames.items():
                parts.setdefault(kind, []).append(df)
    merge_parts(parts)
    return pd.concat(parts["log_step"], ignore_index=True)


@pytest.mark.parametrize("workers", [False, True])
def test_logs_merged_as_they_come_equal_the_merge_of_all(monkeypatch, workers):
    import diag.importers.logs.many as many

    if workers:
        monkeypatch.setattr(many, "PARALLEL_BYTES", 0)
        monkeypatch.setattr(many.os, "cpu_count", lambda: 2)
    paths = [os.path.join(FIX, n) for n in sorted(os.listdir(FIX)) if n.endswith(".log")]
    one_by_one = [(p, import_log(p)) for p in paths]
    got = import_logs(paths)
    assert [p for p, _ in got] == paths
    assert sum("log_step" in g.frames for _, g in got) == 1
    pd.testing.assert_frame_equal(_merged(got), _merged(one_by_one))


def test_every_keyword_holds_an_anchor():
    """The prefilter searches anchors, not the keywords: each keyword must contain one, or lines a
    reader reads would be dropped."""
    for word in prefilter.KEYWORDS:
        assert any(a in word for a in prefilter.ANCHORS), word
    assert all(any(a in w for w in prefilter.KEYWORDS) for a in prefilter.ANCHORS)
