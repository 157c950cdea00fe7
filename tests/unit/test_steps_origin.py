"""Plain torch loops are numbered by the program's own counter (issue 17: an agent attached mid-run
counted from the attach, 62 below the printed iteration, and the two ranks one apart)."""

from __future__ import annotations

import sys

import pytest
import torch

import diag
from diag import agent


@pytest.fixture(autouse=True)
def _no_deepspeed(monkeypatch):
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)


def _model_opt(kind: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    opt = (
        torch.optim.AdamW(model.parameters(), lr=1e-3)
        if kind == "adam"
        else torch.optim.SGD(model.parameters(), lr=0.1)
    )
    return model, opt


def _update(model: torch.nn.Module, opt: torch.optim.Optimizer, step: bool = True) -> None:
    model(torch.randn(3, 4)).sum().backward()
    if step:
        opt.step()
        opt.zero_grad()


def _steps(path) -> tuple[list[int], str | None]:
    tr = diag.load(str(path))
    return [int(s) for s in tr.steps["step"]], tr.headers[next(iter(tr.headers))].get("step_origin")


def test_a_resumed_loop_is_numbered_by_its_iteration_variable(tmp_path):
    model, opt = _model_opt("sgd")
    for iteration in range(100, 103):
        _update(model, opt)
        if iteration == 100:
            agent.start(str(tmp_path), what=("steps",))  # attached mid-run
    agent.stop()
    assert _steps(tmp_path) == ([101, 102], "loop:iteration")


def test_without_a_loop_counter_adams_count_numbers_the_steps(tmp_path):
    model, opt = _model_opt("adam")
    for _ in range(7):
        _update(model, opt)
    agent.start(str(tmp_path), what=("steps",))
    for _ in range(3):
        _update(model, opt)
    agent.stop()
    assert _steps(tmp_path) == ([8, 9, 10], "optimizer")  # 1-based: updates taken, as DeepSpeed


def test_a_micro_step_counter_is_not_taken_for_the_iteration(tmp_path):
    """Gradient accumulation: `step` counts micro batches (4 per update); Adam's count disagrees with
    it, so the count numbers the steps, not the micro-step variable."""
    model, opt = _model_opt("adam")
    started = False
    for step in range(40):
        _update(model, opt, step=step % 4 == 3)
        if step == 13 and not started:
            agent.start(str(tmp_path), what=("steps",))
            started = True
    agent.stop()
    assert _steps(tmp_path) == ([4, 5, 6, 7, 8, 9, 10], "optimizer")


def test_a_counter_that_stops_advancing_by_one_is_dropped(tmp_path):
    """SGD keeps no count: the loop variable is taken on trust at the first step, then dropped when
    it jumps (an epoch-local counter restarting); the numbers go on by one, from the attach."""
    model, opt = _model_opt("sgd")
    agent.start(str(tmp_path), what=("steps",))
    for step in (5, 6, 7, 0, 1):
        _update(model, opt)
        del step
    agent.stop()
    assert _steps(tmp_path) == ([5, 6, 7, 8, 9], "attach")


def test_no_counter_at_all_counts_from_the_attach_and_says_so(tmp_path):
    model, opt = _model_opt("sgd")
    agent.start(str(tmp_path), what=("steps",))
    for _ in range(3):
        _update(model, opt)
    agent.stop()
    assert _steps(tmp_path) == ([0, 1, 2], "attach")
