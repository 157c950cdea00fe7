"""Step boundaries from a plain torch loop, DeepSpeed's engine class and Megatron's optimizer (a real
2-rank DeepSpeed job: tests/integration/test_steps_deepspeed.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

import diag
from diag import agent
from diag.agent.api import StepListener
from tests.unit.no_cuda import NoCudaTorch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plain_loop(n: int) -> torch.nn.Module:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    return model


def test_plain_torch_loop_counts_optimizer_steps(tmp_path, without_deepspeed):
    ag = agent.start(str(tmp_path), what=("steps",))
    seen: list[int] = []
    ag.step_listeners.append(StepListener("test", "step", seen.append))
    _plain_loop(5)
    agent.stop()
    _plain_loop(2)  # after stop: nothing is counted any more
    steps = diag.load(str(tmp_path)).steps
    assert list(steps["step"]) == [0, 1, 2, 3, 4] and seen == [1, 2, 3, 4, 5]
    assert steps["applied"].all() and steps["samples"].isna().all()


def test_torch_hooks_wait_for_an_engine_while_deepspeed_is_loaded(tmp_path):
    import deepspeed.runtime.engine as ds_engine  # loaded, but this loop has no engine
    import torch.optim.optimizer as topt
    from diag.collectors.steps import TORCH_GRACE

    cls = ds_engine.DeepSpeedEngine
    names = ("_take_model_step", "forward", "backward")
    before = [cls.__dict__[n] for n in names]
    agent.start(str(tmp_path), what=("steps", "overflow"))
    assert cls.__dict__["_take_model_step"] is not before[0] and topt._global_optimizer_post_hooks
    _plain_loop(TORCH_GRACE + 3)
    agent.stop()
    assert list(diag.load(str(tmp_path)).steps["step"]) == [0, 1, 2]
    assert [cls.__dict__[n] for n in names] == before and not topt._global_optimizer_post_hooks


def test_deepspeed_imported_after_install_is_patched_at_a_later_step(tmp_path, monkeypatch):
    import deepspeed.runtime.engine as ds_engine
    from diag.collectors.boundary import DsBoundary
    from diag.collectors.steps import TORCH_GRACE

    cls = ds_engine.DeepSpeedEngine
    original = cls.__dict__["_take_model_step"]
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine")  # as if preloaded before the import
    ag = agent.start(str(tmp_path), what=("steps", "overflow"))
    assert cls.__dict__["_take_model_step"] is original
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.engine", ds_engine)  # the job imports it
    _plain_loop(TORCH_GRACE + 1)
    patched = cls.__dict__["_take_model_step"]
    boundary = ag.state.get(DsBoundary)
    agent.stop()
    assert patched is not original and patched.__wrapped__ is original  # one wrapper: steps + overflow
    assert boundary is not None and [p.collector for p in boundary.parts] == ["overflow", "steps"]
    assert cls.__dict__["_take_model_step"] is original


def test_an_engine_still_in_its_init_is_not_a_live_engine():
    """CI saw a PipelineEngine's header without `dp`: the writer thread's scan (`diag run`) found the
    engine inside `deepspeed.initialize`, described it half-built and never again. An engine whose
    `__init__` runs on any thread is left to its first forward."""
    import gc
    import threading

    from deepspeed.runtime.engine import DeepSpeedEngine
    from diag.collectors.steps import live_engines

    inside, release = threading.Event(), threading.Event()
    built: list = []

    class HalfBuilt(DeepSpeedEngine):  # the real hierarchy; its __init__ stops where DeepSpeed's
        def __init__(self) -> None:  # has set global_steps but not yet dp_world_size
            self.__dict__["global_steps"] = 0
            inside.set()
            release.wait(10)
            self.__dict__["dp_world_size"] = 1

    def build() -> None:
        built.append(HalfBuilt())

    t = threading.Thread(target=build)
    t.start()
    try:
        assert inside.wait(10)
        assert [e for e in live_engines(DeepSpeedEngine) if type(e) is HalfBuilt] == []
        release.set()
        t.join(10)
        assert [e for e in live_engines(DeepSpeedEngine) if type(e) is HalfBuilt] == built
    finally:  # (a live engine would be found by every later test's agent: gone before they run)
        release.set()
        t.join(10)
        built.clear()
        gc.collect()
    assert not [e for e in live_engines(DeepSpeedEngine) if type(e).__name__ == "HalfBuilt"]


def test_megatron_optimizer_step_counted_once(tmp_path, monkeypatch):
    import megatron.core.optimizer.optimizer as mo
    from megatron.core.optimizer import OptimizerConfig

    monkeypatch.setattr(mo, "torch", NoCudaTorch())  # its __init__ puts a scale tensor on 'cuda'
    model = torch.nn.Linear(4, 2)
    opt = mo.FP32Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), OptimizerConfig(clip_grad=0.0), None)
    original = mo.FP32Optimizer.__dict__["step"]
    agent.start(str(tmp_path), what=("steps",))
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()  # runs the torch SGD step inside: counted once, by the Megatron wrapper
    agent.stop()
    assert mo.FP32Optimizer.__dict__["step"] is original
    steps = diag.load(str(tmp_path)).steps
    assert list(steps["step"]) == [0, 1, 2] and steps["applied"].all()


def test_megatron_steps_carry_the_loops_iteration(tmp_path, monkeypatch):
    """Issue 9: a Megatron loop's `args.iteration` (set after each step; Megatron-LM keeps its args in
    megatron.training.global_vars, not installed here: its module is stood in for) numbers the steps."""
    import types

    import megatron.core.optimizer.optimizer as mo
    from megatron.core.optimizer import OptimizerConfig

    monkeypatch.setattr(mo, "torch", NoCudaTorch())
    args = types.SimpleNamespace(iteration=40)  # resumed from a checkpoint at iteration 40
    monkeypatch.setitem(
        sys.modules, "megatron.training.global_vars", types.SimpleNamespace(_GLOBAL_ARGS=args)
    )
    model = torch.nn.Linear(4, 2)
    opt = mo.FP32Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), OptimizerConfig(clip_grad=0.0), None)
    agent.start(str(tmp_path), what=("steps",))
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        args.iteration += 1  # as Megatron's train loop does after train_step
    agent.stop()
    assert list(diag.load(str(tmp_path)).steps["step"]) == [41, 42, 43]


def test_faults_never_reach_the_loop_and_are_counted(tmp_path, without_deepspeed):
    ag = agent.start(str(tmp_path), what=("steps",), faults={"steps": "raise"})
    torch.manual_seed(0)
    got = _plain_loop(4).weight.detach().clone()
    errors = dict(ag.errors)
    agent.stop()
    torch.manual_seed(0)
    assert torch.equal(got, _plain_loop(4).weight)  # same numerics as without the agent
    assert errors.pop(("steps", "torch-post", "InjectedFault")) == 4  # one a step
    # the writer thread's late install (an idle listener) runs, and faults, while modules are still
    # being imported: in a process of its own this test saw it; after other tests, not
    assert set(errors) <= {("steps", "late-install", "InjectedFault")}, errors


LATE_IMPORT = """
import sys, time
from diag import agent
agent.start(sys.argv[1], what=("steps", "overflow"))
assert "deepspeed" not in sys.modules
from deepspeed.runtime.engine import DeepSpeedEngine as E
deadline = time.monotonic() + 10
wrapped = lambda: hasattr(E._take_model_step, "__wrapped__") and hasattr(E.backward, "__wrapped__")
while not wrapped() and time.monotonic() < deadline:  # each collector patches in its own late scan
    time.sleep(0.02)
print(hasattr(E._take_model_step, "__wrapped__"), hasattr(E.backward, "__wrapped__"))
agent.stop()
print(hasattr(E._take_model_step, "__wrapped__"), hasattr(E.backward, "__wrapped__"))
"""


def test_framework_imported_after_start_is_wrapped_before_any_step(tmp_path) -> None:
    """`diag run` starts the agent before the job imports DeepSpeed; the engine must be wrapped
    before the first step (the first fp16 steps overflow and never reach a torch optimizer step,
    which used to be the only late-patch point: Megatron-DeepSpeed's first 9 iterations were lost),
    and unwrapped by stop."""
    out = subprocess.run(
        [sys.executable, "-c", LATE_IMPORT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    ).stdout.split("\n")
    assert [line for line in out if line.startswith(("True", "False"))] == ["True True", "False False"]


def test_a_framework_half_imported_at_a_scan_is_patched_once_its_import_ends(tmp_path, monkeypatch):
    """Late patching rescans only when sys.modules grew (each step and each flush ask), except after
    a scan that found the engine's module still executing (in sys.modules, its class not defined yet):
    the class appears without sys.modules growing, and must still be wrapped."""
    import types

    import deepspeed.runtime.engine as ds_engine
    from diag.collectors.steps import TORCH_GRACE

    cls = ds_engine.DeepSpeedEngine
    original = cls.__dict__["_take_model_step"]
    half = types.ModuleType("deepspeed.runtime.engine")  # its body has not reached the class yet
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.engine", half)
    agent.start(str(tmp_path), what=("steps", "overflow"))
    _plain_loop(TORCH_GRACE + 1)
    assert cls.__dict__["_take_model_step"] is original
    count = len(sys.modules)
    half.DeepSpeedEngine = cls  # the import finishes
    _plain_loop(TORCH_GRACE + 1)
    patched = cls.__dict__["_take_model_step"]
    agent.stop()
    assert len(sys.modules) == count
    assert patched is not original and patched.__wrapped__ is original  # one wrapper: steps + overflow
    assert cls.__dict__["_take_model_step"] is original


def test_torch_optimizer_hook_is_dropped_once_an_engine_numbers_the_steps(tmp_path, monkeypatch):
    """Once a DeepSpeed engine is seen, torch's optimizer post-hook only returns: it is removed (a
    call fewer per step), and the plain loop's steps stop counting; detach still ends clean."""
    import torch.optim.optimizer as topt

    ag = agent.start(str(tmp_path), what=("steps",))
    assert topt._global_optimizer_post_hooks
    _plain_loop(3 + 2)  # TORCH_GRACE steps ignored while deepspeed is loaded, then counted
    monkeypatch.setattr(ag, "saw_engine", lambda engine: setattr(ag, "engine", engine))
    late = ag.idle_listeners[0]  # the steps collector's late install: its state's bound method
    state = late.__wrapped__.__self__
    engine = type("Engine", (), {"global_steps": 41})()  # weak-referenceable, as engines are
    state.see(engine)
    assert not topt._global_optimizer_post_hooks and ag.engine is engine
    agent.stop()
    assert not topt._global_optimizer_post_hooks


def test_boundary_reads_only_the_counters_once_every_part_said_so(tmp_path):
    """DeepSpeed's boundary asks each part before the step until every part has answered PLAIN for
    an engine; that engine's later steps read (global_steps, global_samples) alone and hand them to
    every part. An engine whose part needs more (fp16's loss scale) is asked every step, and a part
    added later makes the next step ask again."""
    from diag.collectors.boundary import PLAIN, DsBoundary, Part

    from diag.agent.undo import Undo

    class Engine:
        def __init__(self, fp16: bool) -> None:
            self.global_steps, self.global_samples, self.fp16 = 0, 0, fp16

        def _take_model_step(self) -> None:
            self.global_steps += 1
            self.global_samples += 4

    asked: list[bool] = []
    got: list[tuple[str, object]] = []

    def before(engine: Engine) -> object:
        asked.append(engine.fp16)
        return (engine.global_steps, 0.5, True) if engine.fp16 else PLAIN

    ag = agent.start(str(tmp_path), what=())
    undo = Undo()
    boundary = DsBoundary(ag, undo)
    boundary.add(Part(0, "overflow", before, lambda e, t: got.append(("o", t))))
    boundary.add(Part(1, "steps", None, lambda e, t: got.append(("s", t))))
    boundary.patch(Engine)
    bf16, fp16 = Engine(False), Engine(True)
    for _ in range(3):
        bf16._take_model_step()
    assert asked == [False]  # the first step only
    assert got == [("o", (0, 0)), ("s", (0, 0)), ("o", (1, 4)), ("s", (1, 4)), ("o", (2, 8)), ("s", (2, 8))]
    got.clear()
    fp16._take_model_step()
    fp16._take_model_step()
    assert asked == [False, True, True] and got == [
        ("o", (0, 0.5, True)),
        ("s", (0, 0)),
        ("o", (1, 0.5, True)),
        ("s", (1, 4)),
    ]
    got.clear()
    boundary.add(Part(2, "late", None, lambda e, t: got.append(("l", t))))
    bf16._take_model_step()
    bf16._take_model_step()
    assert asked == [False, True, True, False]  # asked again once, for the new part
    assert [name for name, _ in got] == ["o", "s", "l", "o", "s", "l"] and got[-1] == ("l", (4, 16))
    undo.run()
    errors = dict(ag.errors)
    agent.stop()
    assert errors == {} and "__wrapped__" not in Engine.__dict__["_take_model_step"].__dict__
