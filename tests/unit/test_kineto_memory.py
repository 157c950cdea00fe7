"""Memory of one Kineto file's import (issue 14: bounded-memory analysis): the file's bytes are held
once, and a name repeated by many events once. Measured with tracemalloc (the Python allocations,
the same on every run), never timed."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc

import pandas as pd
import pytest

from diag.importers import ImportProblem, kineto_events
from diag.importers.kineto import import_file
from diag.importers.kineto_stream import parse_streamed
from diag.trace import safeio

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "sample_traces")
SAMPLE = os.path.join(SAMPLES, "kineto_gloo_dp")
PRETTY = ("kineto_gloo_dp/rank0.json.gz", "kineto_gpt_ds_fp16/rank1.pt.trace.json.gz")


def _plain(tmp_path, name: str) -> str:
    """An uncompressed copy of a sample trace (torch's own pretty-printed export)."""
    out = tmp_path / os.path.basename(name).removesuffix(".gz")
    with gzip.open(os.path.join(SAMPLES, name)) as f:
        out.write_bytes(f.read())
    return str(out)


def _same_frames(a, b) -> None:
    assert a[0] == b[0] and {**a[1], "path": ""} == {**b[1], "path": ""}
    assert a[2].keys() == b[2].keys()
    for kind in a[2]:
        pd.testing.assert_frame_equal(a[2][kind], b[2][kind])


@pytest.mark.parametrize("name", PRETTY)
def test_a_streamed_file_gives_the_frames_of_a_whole_parse(tmp_path, monkeypatch, name):
    path = _plain(tmp_path, name)
    monkeypatch.setattr(kineto_events, "CHUNK", 5000)  # many pieces, cuts across every boundary
    assert parse_streamed(path) is not None
    streamed = import_file(path)
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(json.loads(open(path, "rb").read())))  # one line: parsed whole
    assert parse_streamed(str(compact)) is None
    _same_frames(streamed, import_file(str(compact)))
    assert len(streamed[2]["cpu_op"]) > 800


def test_what_cannot_be_streamed_is_read_whole(tmp_path):
    """gzip, keys after the events that look like events, a file cut short: None, and the import
    is what the whole read gives (frames, or the same one-line problem)."""
    gz = os.path.join(SAMPLES, PRETTY[0])
    assert parse_streamed(gz) is None
    path = _plain(tmp_path, PRETTY[0])
    text = open(path).read()
    doc = json.loads(text)
    tail = tmp_path / "tail.json"  # a list of objects after the events, at their indent
    tail.write_text(
        text.rstrip().removesuffix("}") + ',\n  "extra": [\n  {\n  "a": 1\n  },\n  {\n  "b": 2\n  }\n  ]\n}'
    )
    assert json.loads(tail.read_text())["extra"] == [{"a": 1}, {"b": 2}]
    _same_frames(import_file(str(tail)), import_file(path))
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    assert parse_streamed(str(cut)) is None
    with pytest.raises(ImportProblem, match="invalid JSON"):
        import_file(str(cut))
    assert doc["traceEvents"]


def test_a_streamed_file_is_never_held_whole(tmp_path, monkeypatch):
    """A 150 MiB rank file: peak 213 -> 82 MiB above start (0.55x its size), 3.1 -> 2.2 CPU s. Here
    8 MiB, pretty-printed as torch writes it, read in 64 KiB pieces: the whole read holds the bytes
    and more, the streamed one less than the file."""
    from bench.analyze import resized

    with gzip.open(os.path.join(SAMPLE, "gpu-rank0.json.gz")) as f:
        doc = json.load(f)
    path = str(tmp_path / "rank0.json")
    with open(path, "w") as f:
        json.dump(resized(doc, 100), f, indent=2)
    size = os.path.getsize(path)
    monkeypatch.setattr(kineto_events, "CHUNK", 1 << 16)
    peaks = []
    for read in (
        lambda: kineto_events.read_events(path),
        lambda: kineto_events._parse_chunks(safeio.read_limited(path)),
    ):
        tracemalloc.start()
        try:
            read()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert size > 4 << 20 and peaks[0] < 0.8 * size < size < peaks[1], [p / size for p in peaks]
