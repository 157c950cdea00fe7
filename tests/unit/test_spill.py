"""`spill.spilled`: the frames the windowed pass's later passes never read are out of memory while
a pass runs and back after it, the same objects in the same places (docs/scale.md, session 30)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pandas as pd
import pytest

from diag.metrics import spill


def _frames() -> tuple[dict, dict, dict, pd.DataFrame]:
    step = pd.DataFrame(
        {"rank": np.repeat([0, 1], 3), "step": np.tile([1, 2, 3], 2), "dur": np.arange(6.0)}
    ).assign(device=pd.Categorical(["cpu"] * 6))
    memory = pd.DataFrame({"rank": [0, 1], "step": [1, 1], "rss": [None, None]})
    shown = step[["rank", "step"]].copy()  # shares nothing
    held = {"step": step, "memory": memory, "empty": pd.DataFrame(), "note": "kept as is"}
    figures = {"step": step}  # the same object in two places
    per_step = {"sum": pd.Series([0.5, 1.5], index=pd.MultiIndex.from_tuples([(0, 1), (1, 1)]))}
    return held, figures, per_step, shown


def test_frames_are_out_of_memory_in_the_block_and_back_after_it():
    held, figures, per_step, keep = _frames()
    want = {k: v.copy() for k, v in held.items() if isinstance(v, pd.DataFrame)}
    want_sum = per_step["sum"].copy()
    gone = weakref.ref(held["memory"])
    with spill.spilled([held, figures, per_step], keep=[keep]) as count:
        gc.collect()
        assert count == 4  # step (one object in two places), memory, per_step's sum; not the empty one
        assert gone() is None  # freed, not merely unlisted
        assert set(held) == {"empty", "note"} and not figures and not per_step
    for k, v in want.items():
        pd.testing.assert_frame_equal(held[k], v)
    assert figures["step"] is held["step"]  # one object again
    pd.testing.assert_series_equal(per_step["sum"], want_sum)
    assert held["note"] == "kept as is"


def test_a_frame_sharing_memory_with_one_held_meanwhile_stays():
    """A step frame whose columns the steps' frame shares (`steps.step_frame` where no row is
    dropped): spilled, its copy read back would be held beside the shared columns."""
    held, figures, _, _ = _frames()
    shared = held["step"]
    view = pd.DataFrame({"dur": shared["dur"].to_numpy()[1:]}, copy=False)
    assert np.shares_memory(view["dur"].to_numpy(), shared["dur"].to_numpy())
    with spill.spilled([held, figures], keep=[view]) as count:
        assert held["step"] is shared and figures["step"] is shared
        assert count == 1 and "memory" not in held
    assert held["step"] is shared


def test_frames_come_back_when_the_block_raises():
    held, figures, per_step, keep = _frames()
    want = held["memory"].copy()
    with pytest.raises(RuntimeError), spill.spilled([held, figures, per_step], keep=[keep]):
        assert "memory" not in held
        raise RuntimeError("the files changed")
    pd.testing.assert_frame_equal(held["memory"], want)


def test_nothing_is_spilled_where_the_file_cannot_be_written(monkeypatch):
    held, figures, per_step, keep = _frames()
    before = dict(held)

    def full(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill.pickle, "dump", full)
    with spill.spilled([held, figures, per_step], keep=[keep]) as count:
        assert count == 0 and held == before


def test_nothing_is_spilled_without_a_temporary_directory(monkeypatch, tmp_path):
    held, figures, per_step, keep = _frames()
    before = dict(held)
    monkeypatch.setattr(spill.tempfile, "tempdir", str(tmp_path / "gone"))
    with spill.spilled([held, figures, per_step], keep=[keep]) as count:
        assert count == 0 and held == before
