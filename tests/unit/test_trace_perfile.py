"""A diag trace read one rank file at a time (`perfile`) gives the frames of reading every record
together, on every diag trace among the samples and fixtures, and on mixes of dtypes across files."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from diag.trace import reader
from diag.trace.perfile import PerFile, Uneven
from tests.conftest import sample_folders

DIRS = [d for d in sample_folders() if any(f.endswith(".jsonl") for f in os.listdir(d))]


def _same(a, b) -> None:
    assert a.headers == b.headers
    assert [str(p) for p in a.problems] == [str(p) for p in b.problems]
    assert a.frames.keys() == b.frames.keys()
    for kind in a.frames:
        pd.testing.assert_frame_equal(a.frames[kind], b.frames[kind], obj=kind)


def test_the_samples_hold_diag_traces():
    assert len(DIRS) >= 15


@pytest.mark.parametrize("chunk", [reader.CHUNK, 7], ids=["whole-files", "chunks-of-7"])
@pytest.mark.parametrize("path", DIRS, ids=os.path.basename)
def test_per_file_frames_equal_the_joint_read(path, chunk, monkeypatch):
    """Also with each file's records turned into columns 7 at a time (a long rank file's are a
    `reader.CHUNK` at a time): groups renamed at a file's end reach its first chunks too."""
    monkeypatch.setattr(reader, "CHUNK", chunk)
    per_file = reader._load(path, False, reader.ALL, PerFile())
    _same(per_file, reader._load(path, False, reader.ALL, None))
    assert reader.load_trace(path).frames.keys() == per_file.frames.keys()


def _write(tmp_path, rank: int, records: list[dict]) -> None:
    header = {"k": "header", "schema": 1, "rank": rank, "pid": 100 + rank, "world_size": 2}
    lines = [json.dumps(header)] + [json.dumps({"k": "comm", "step": 0, **r}) for r in records]
    (tmp_path / f"rank-{rank:05d}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "a, b, uneven",
    [
        ([{"ts": 1, "bytes": 4}], [{"ts": 2, "bytes": None}], False),  # ints + None: float64
        ([{"ts": 1, "bytes": 4}], [{"ts": 2, "bytes": 2.5}], False),  # ints + floats
        ([{"ts": 1, "bytes": 4}], [{"ts": 2}], False),  # a key one file never writes
        ([{"ts": 1, "op": "all_reduce"}], [{"ts": 2, "op": None}], False),
        ([{"ts": 1, "op": "all_reduce"}], [{"ts": 2, "op": "broadcast"}], False),  # categories
        ([{"ts": 1, "async_op": True}], [{"ts": 2, "async_op": None}], False),  # bool + None
        ([{"ts": 1, "x": 4}], [{"ts": 2, "x": "4"}], True),  # numbers + strings (a field unknown)
        ([{"ts": 1, "x": True}], [{"ts": 2, "x": 1}], True),
        ([{"ts": 1, "x": "a"}], [{"ts": 2, "x": None}, {"ts": 3, "x": 2}], True),
        ([{"ts": 1, "bytes": 4, "x": None}], [{"ts": 2, "bytes": None, "x": [1]}], False),
        ([{"ts": 1, "op": "broadcast"}], [{"ts": 2}], False),  # a categorical one file lacks
        ([{"ts": 1, "group": "tp"}], [{"ts": 2, "group": None, "module": "fc"}], False),
        ([{"ts": 1, "group": 1}], [{"ts": 2, "group": "tp"}], True),  # categories of mixed types
    ],
)
def test_files_whose_dtypes_differ(tmp_path, a, b, uneven):
    """What one reading of every record gives, whether joined per file or (Uneven) read again."""
    _write(tmp_path, 0, a)
    _write(tmp_path, 1, b)
    path = str(tmp_path)
    joint = reader._load(path, False, reader.ALL, None)
    if uneven:
        with pytest.raises(Uneven):
            reader._load(path, False, reader.ALL, PerFile())
    else:
        _same(reader._load(path, False, reader.ALL, PerFile()), joint)
    _same(reader.load_trace(path), joint)


def test_a_long_tiled_trace_reads_the_same_per_file(tmp_path):
    """bench.analyze's long diag traces (the real ZeRO-3 run's steps tiled): every step there, and
    the per-file read equal to the joint one on them too."""
    from bench.analyze import make_diag_input

    make_diag_input(str(tmp_path), 3, 20)
    path = str(tmp_path / "traces")
    per_file = reader._load(path, False, reader.ALL, PerFile())
    _same(per_file, reader._load(path, False, reader.ALL, None))
    steps = per_file.frames["step"]
    assert sorted(steps["rank"].unique()) == [0, 1, 2]
    assert all(sorted(g) == list(range(20)) for _, g in steps.groupby("rank")["step"])


def test_a_group_renamed_at_a_files_end_reaches_its_chunks_already_read(tmp_path, monkeypatch):
    """A group named by its role after its first collectives (`renamed` in the `groups` meta, at the
    end of the file here): its records read as columns before the meta carry the name too."""
    monkeypatch.setattr(reader, "CHUNK", 3)
    groups = {"5": {"role": "dp", "size": 2, "ranks": [0, 1], "renamed": "dp:5"}}
    for rank in (0, 1):
        recs = [
            {
                "ts": t,
                "op": "all_reduce",
                "group": "5",
                "bytes": 4,
                "async_op": t < 3 or (None if t % 2 else False),
            }
            for t in range(10)
        ]
        _write(tmp_path, rank, recs)
        with open(tmp_path / f"rank-{rank:05d}.jsonl", "a") as f:
            f.write(json.dumps({"k": "meta", "ts": 99, "key": "groups", "value": groups}) + "\n")
    path = str(tmp_path)
    per_file = reader._load(path, False, reader.ALL, PerFile())
    _same(per_file, reader._load(path, False, reader.ALL, None))
    assert set(per_file.frames["comm"]["group"]) == {"dp:5"}


def test_alike_files_are_joined_column_by_column():
    """Files of the same columns and dtypes are joined one column at a time (each column's parts
    freed as it is joined): the frame `concat` gives, and nothing left in the parts."""
    from diag.trace.perfile import join

    def part(n: int, start: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "ts": range(start, start + n),
                "op": pd.Categorical(["all_reduce", "broadcast"] * (n // 2), ["all_reduce", "broadcast"]),
                "busbw": [0.5 * i for i in range(n)],
                "async_op": [True, False] * (n // 2),
                "group_ranks": [[0, 1]] * n,
            }
        )

    parts = [part(4, 0), part(2, 10), part(6, 20)]
    expected = pd.concat([p.copy() for p in parts], ignore_index=True)
    pd.testing.assert_frame_equal(join(parts), expected)
    assert all(p.columns.empty for p in parts)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    """What the reader did before: the whole frame sorted at once."""
    return df.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)


def test_rows_by_rank_and_time_as_the_whole_sort_gives_them():
    """`by_rank_and_time` (the frame in order kept as it is, else a lexsort taken one column at a
    time) orders the rows as `sort_values` does: every sample's frames, shuffled, and with ties,
    missing ranks and times, and times that are not numbers."""
    import numpy as np

    rng = np.random.default_rng(0)
    frames = [df for d in DIRS for df in reader._load(d, False, reader.ALL, None).frames.values()]
    frames = [df for df in frames if "ts" in df.columns]
    assert sum(len(df) for df in frames) > 10_000
    for df in frames:
        shuffled = df.iloc[rng.permutation(len(df))].reset_index(drop=True)
        for case in (df, shuffled):
            pd.testing.assert_frame_equal(reader.by_rank_and_time(case.copy()), _sorted(case))
    ties = pd.DataFrame({"rank": [1, 0, 1, 0, 0], "ts": [5, 5, 5, 2, 5], "v": list("abcde")})
    pd.testing.assert_frame_equal(reader.by_rank_and_time(ties.copy()), _sorted(ties))
    assert list(reader.by_rank_and_time(ties.copy())["v"]) == list("dbeac")
    for rank, ts in (
        ([1, None, 0, 0], [3.0, 1.0, float("nan"), 2.0]),  # missing values: where sort_values puts them
        ([0, 0, 1], ["b", "a", "c"]),  # not numbers
        ([0, 1, 1], [1, 2, 3]),  # in order already
    ):
        odd = pd.DataFrame({"rank": rank, "ts": ts, "v": range(len(rank))})
        pd.testing.assert_frame_equal(reader.by_rank_and_time(odd.copy()), _sorted(odd))
