"""Module tracking: fully qualified names, and `agent.module_stack` right in forward AND backward, so
that work issued in a module's backward (a gradient hook, a collective) is attributed to it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from diag.collectors import modules
from torch.nn.modules import module as torch_module

from diag import agent as diag_agent


class Probe(torch.nn.Module):
    """Records the module stack when its forward and its backward run (like a TP all_reduce in a
    parallel linear layer; it owns a parameter: parameter-less leaves are tracked on sampled steps
    only)."""

    def __init__(self, agent: Any, log: list[tuple[str, list[str]]]) -> None:
        super().__init__()
        self.agent, self.log = agent, log
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Record.apply(x, self)


class _Record(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, probe: Probe) -> torch.Tensor:  # type: ignore[override]
        ctx.probe = probe
        probe.log.append(("fwd", list(probe.agent.module_stack)))
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.probe.log.append(("bwd", list(ctx.probe.agent.module_stack)))
        return grad, None


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Block(torch.nn.Module):
    def __init__(self, agent: Any, log: list[tuple[str, list[str]]]) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.probe = Probe(agent, log)
        self.skip = Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.skip(self.probe(self.fc(x))) + x


class Net(torch.nn.Module):
    def __init__(self, agent: Any, log: list[tuple[str, list[str]]]) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.layers = torch.nn.ModuleList([Block(agent, log) for _ in range(2)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return h


class Engine(torch.nn.Module):
    """Stands for a DeepSpeedEngine: the model is its `.module`."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, *args: Any) -> torch.Tensor:
        return self.module(*args)


@pytest.fixture
def agent(tmp_path):
    ag = diag_agent.start(str(tmp_path), what=("steps",))
    modules.ensure_installed(ag, ag.undo)
    yield ag
    diag_agent.stop()


def test_forward_and_backward_attribution(agent) -> None:
    log: list[tuple[str, list[str]]] = []
    engine = Engine(Net(agent, log))
    grads_seen: list[list[str]] = []
    weight = engine.module.layers[1].fc.weight
    weight.register_post_accumulate_grad_hook(lambda p: grads_seen.append(list(agent.module_stack)))
    engine(torch.randint(0, 10, (3, 2))).sum().backward()

    fwd = [stack for phase, stack in log if phase == "fwd"]
    bwd = [stack for phase, stack in log if phase == "bwd"]
    assert fwd == [["Engine", "module", f"module.layers.{i}", f"module.layers.{i}.probe"] for i in (0, 1)]
    # backward runs layers in reverse, each attributed to its own module and its parents
    assert bwd == list(reversed(fwd))
    # a gradient hook (where ZeRO issues its reduce) runs inside the weight's module
    assert grads_seen and grads_seen[0][-1] == "module.layers.1.fc"
    assert agent.module_stack == []  # restored at the end of backward


def test_identity_module_does_not_steal_backward(agent) -> None:
    log: list[tuple[str, list[str]]] = []
    net = Net(agent, log)
    net(torch.randint(0, 10, (3, 2))).sum().backward()
    assert all(stack[-1].endswith(".probe") for phase, stack in log if phase == "bwd")


def test_names_of_a_submodule_called_first_are_still_fully_qualified(agent) -> None:
    log: list[tuple[str, list[str]]] = []
    net = Net(agent, log)
    net.layers[1](torch.randn(2, 4))  # the tree's root is found through gc, not the call
    assert log[-1][1][-1] == "layers.1.probe"
    assert agent.state.get(modules.ModuleTracker).name_of(net) == "Net"


def test_ensure_installed_is_idempotent_and_stop_removes_hooks(tmp_path) -> None:
    before = len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)
    ag = diag_agent.start(str(tmp_path), what=("steps",))
    first = modules.ensure_installed(ag, ag.undo)
    assert modules.ensure_installed(ag, ag.undo) is first
    assert len(torch_module._global_forward_pre_hooks) == before[0] + 1
    diag_agent.stop()
    after = len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)
    assert after == before
    assert modules.ModuleTracker not in ag.state


def test_backward_hooks_left_on_a_graph_are_inert_after_stop(tmp_path) -> None:
    ag = diag_agent.start(str(tmp_path), what=("steps",))
    modules.ensure_installed(ag, ag.undo)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    loss = net(torch.randn(2, 3)).sum()
    diag_agent.stop()
    loss.backward()  # the graph still carries our pre-hooks
    assert ag.module_stack == [] and not ag.errors


def test_global_hooks_only_on_tracked_steps(tmp_path) -> None:
    """attribute_every=3, layers_every=5: hooks stay on until the first boundary, then only on the
    first 3 steps and steps 3k and 5k (sampled steps need the tracker); other steps run torch's fast
    path."""
    base = len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)
    ag = diag_agent.start(str(tmp_path), what=("steps",), attribute_every=3, layers_every=5)
    modules.ensure_installed(ag, ag.undo)

    def hooked() -> bool:
        now = len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)
        assert now in (base, (base[0] + 1, base[1] + 1))
        return now != base

    assert hooked()  # before any step boundary
    on = []
    for step in range(1, 11):
        ag.begin_step(step)
        on.append(hooked())
    assert [s for s, h in zip(range(1, 11), on) if h] == [1, 2, 3, 5, 6, 9, 10]
    log: list[tuple[str, list[str]]] = []
    net = Net(ag, log)
    ag.begin_step(11)  # untracked: no stack, no backward hooks on the graph
    net(torch.randint(0, 10, (3, 2))).sum().backward()
    assert [stack for _, stack in log] == [[]] * 4 and not ag.errors
    ag.begin_step(12)
    net(torch.randint(0, 10, (3, 2))).sum().backward()
    names = ["layers.0.probe", "layers.1.probe"]
    assert [stack[-1] for _, stack in log[4:]] == names + names[::-1]  # forward, then backward
    tracker = ag.state.get(modules.ModuleTracker)
    diag_agent.stop()
    assert (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)) == base
    tracker.on_step(30)  # a boundary racing a stop() from another thread: installs nothing
    assert (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)) == base


def test_a_stop_racing_a_boundary_that_turns_the_hooks_on_leaves_none(tmp_path, monkeypatch) -> None:
    """A detach (stop() on the control thread) while the training thread's boundary is between
    `_hooks_on`'s `live` test and its registration: the stop waits for it and removes what it
    registered. It used to find the hooks off, return, and leave them on the job (a compat-leg CI
    run saw one global forward pre-hook left after `diag detach`)."""
    import threading

    base = len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)
    ag = diag_agent.start(str(tmp_path), what=("steps",), attribute_every=3, layers_every=0)
    modules.ensure_installed(ag, ag.undo)
    ag.begin_step(1)
    ag.begin_step(4)  # untracked: the hooks are off
    assert (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)) == base
    register = modules.register_module_forward_pre_hook
    stopper = threading.Thread(target=diag_agent.stop, name="stopper")

    def racing(hook: Any) -> Any:
        stopper.start()
        stopper.join(0.5)  # the stop runs now, as far as it can
        return register(hook)

    monkeypatch.setattr(modules, "register_module_forward_pre_hook", racing)
    ag.begin_step(6)  # tracked: turns the hooks on while the stop runs
    stopper.join(10)
    assert not stopper.is_alive()
    assert (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)) == base
    assert diag_agent.current() is None
