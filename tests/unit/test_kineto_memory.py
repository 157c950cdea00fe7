"""Memory of one Kineto file's import (issue 14: bounded-memory analysis): the file's bytes are held
once, and a name repeated by many events once. Measured with tracemalloc (the Python allocations,
the same on every run), never timed."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc

from diag.importers import kineto_events
from diag.trace import safeio

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "sample_traces", "kineto_gloo_dp")


def test_an_uncompressed_file_is_read_into_one_copy(tmp_path):
    """`head + rest` copied every uncompressed file once more: a 150 MiB rank file peaked at 299 MiB
    in the worker reading it."""
    path = tmp_path / "rank0.json"
    with gzip.open(os.path.join(SAMPLE, "gpu-rank0.json.gz")) as f:
        path.write_bytes(f.read() * 8)  # not JSON: only the read is measured
    size = path.stat().st_size
    tracemalloc.start()
    try:
        data = safeio.read_limited(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(data) == size and peak < 1.2 * size, peak / size


def test_the_chunks_of_a_file_share_their_names():
    """The parser makes one string object per event; the columns keep the first equal one, shared
    by every chunk of the file (a 150 MiB rank file: peak 246 -> 213 MiB, 116 -> 82 MiB after)."""
    with gzip.open(os.path.join(SAMPLE, "gpu-rank0.json.gz")) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    names: dict[str, str] = {}
    first, second = (kineto_events._frames(json.loads(json.dumps(events)), names) for _ in range(2))
    a, b = first["host"], second["host"]
    assert a["name"].tolist() == b["name"].tolist() == [e["name"] for e in events]
    assert all(x is y for x, y in zip(a["name"], b["name"])) and all(
        x is y for x, y in zip(a["cat"], b["cat"])
    )
    assert len(names) < len(events) / 5
