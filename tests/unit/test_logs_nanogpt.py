"""nanoGPT's own log (karpathy/nanoGPT train.py, 2-rank DDP on CPU/gloo: the fixture is the head of
that run's stdout): `iter N: loss X, time Y ms, mfu Z%` and `step N: train loss X, val loss Y`."""

from __future__ import annotations

import os

import pytest

from diag.importers import detect
from diag.importers.logs import import_log

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logs", "nanogpt_ddp.log")


def test_iter_and_eval_lines_become_steps_numbered_as_nanogpt_numbers_them() -> None:
    res = import_log(FIX)
    steps = res.frames["log_step"].set_index("step")
    assert list(steps.index) == list(range(12))  # iter 0 .. iter 11
    assert steps.loc[1, "iter_ms"] == pytest.approx(490.42)
    assert steps.loc[11, "iter_ms"] == pytest.approx(566.23)
    assert steps.loc[3, "loss"] == pytest.approx(10.8362)
    assert steps.loc[0, "eval_loss"] == pytest.approx(10.8388)  # val loss, evaluated before iter 0
    assert steps.loc[0, "loss"] == pytest.approx(10.8359)  # the step's own line, not the eval's
    assert steps["eval_loss"].notna().sum() == 1
    assert steps["tflops"].isna().all()  # nanoGPT's MFU estimate is not read as a measured figure
    assert res.problems == []
    assert detect.kind_of_file(FIX) == detect.LOG


def test_a_line_that_only_looks_like_it_is_not_read(tmp_path) -> None:
    path = tmp_path / "x.log"
    path.write_text("iter 3: loss of signal, time 5ms, mfu 1%\nstep 2: train loss 1.0\n")
    with pytest.raises(Exception, match="no DeepSpeed/Megatron/HF Trainer/verl/nanoGPT progress"):
        import_log(str(path))
