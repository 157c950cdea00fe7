"""Overflow records from Megatron's grad scaler, and host scalars read without a device sync (the
real DeepSpeed fp16 / bf16 runs: tests/integration/test_overflow_deepspeed.py)."""

from __future__ import annotations

import math

import torch

import diag
from diag import agent
from tests.unit.no_cuda import NoCudaTorch


def test_megatron_dynamic_grad_scaler(tmp_path, monkeypatch):
    import megatron.core.optimizer.grad_scaler as gs

    monkeypatch.setattr(gs, "torch", NoCudaTorch())  # it puts its scale tensors on 'cuda'
    scaler = gs.DynamicGradScaler(
        initial_scale=2.0**16,
        min_scale=1.0,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=3,
        hysteresis=2,
    )
    ag = agent.start(str(tmp_path), what=("overflow",))
    found = [False, True, True, False, False, False]
    expected = []
    for step, inf in enumerate(found):
        ag.begin_step(step)
        before = float(scaler.scale)
        scaler.update(inf)
        expected.append((step, inf, before, float(scaler.scale)))
    agent.stop()
    scaler.update(True)  # after stop: unrecorded
    ov = diag.load(str(tmp_path)).overflow
    got = list(zip(ov["step"], ov["overflow"], ov["scale_before"], ov["scale_after"]))
    assert got == expected
    assert any(b != a for _, _, b, a in expected)  # the sequence both halves and doubles the scale
    assert list(ov["skipped_steps"]) == [0, 1, 2, 2, 2, 2] and (ov["source"] == "megatron").all()


def test_host_values_never_sync():
    from diag.collectors import device

    assert device.host_float(1.5) == 1.5 and device.host_float(True) is None
    x = torch.tensor(math.inf, requires_grad=True) * 2
    assert device.host_float(x) == math.inf  # a CPU scalar: read without a warning or a copy
    assert device.host_float(torch.ones(2)) is None and device.host_float(None) is None


def test_losses_are_read_only_where_the_grad_norm_does_not_settle_the_step(tmp_path, monkeypatch):
    """DeepSpeed bf16/fp32: a non-finite loss makes the grad norm non-finite, so the losses kept from
    backward are read (item(), ~20 us in a job) only when the norm is not finite or not on the host;
    backward(retain_graph=True) is read at once, its graph (activations) never kept."""
    import types

    import deepspeed.runtime.engine as ds_engine
    from diag.collectors import overflow
    from diag.collectors.boundary import PLAIN

    from diag.agent.undo import Undo

    read: list[object] = []
    real = overflow._nonfinite
    monkeypatch.setattr(overflow, "_nonfinite", lambda v: read.append(v) or real(v))
    ag = agent.start(str(tmp_path), what=("steps",))
    state = overflow._Overflow(ag, Undo())
    state.retain_at = overflow._after_loss(ds_engine.DeepSpeedEngine.backward, "retain_graph")
    engine = types.SimpleNamespace(fp16_enabled=lambda: False, global_steps=7, skipped_steps=0)

    def step(norm: object, *losses: object) -> None:
        for loss in losses:
            state._loss_check(engine, loss)
        token = state._ds_before(engine)
        if token is PLAIN:  # not fp16: the boundary hands it the counters
            token = (engine.global_steps, 0)
        engine.global_steps += 1
        engine._global_grad_norm = norm
        state._ds_after(engine, token)

    step(torch.tensor(1.5), torch.tensor(2.0), torch.tensor(2.1))  # healthy: no loss read
    assert read == [] and state.losses == []
    step(torch.tensor(math.inf), torch.tensor(2.0), torch.tensor(math.nan))  # both records
    step(None, torch.tensor(math.inf))  # no norm on the host: the loss is read
    state._loss_check(engine, torch.tensor(math.nan), retain_graph=True)  # read now, nothing kept
    assert state.losses == [] and len(read) == 4
    agent.stop()
    ov = diag.load(str(tmp_path)).overflow
    got = sorted(zip(ov["step"], ov["source"]))
    assert got == [
        (9, "nonfinite_grad_norm"),
        (9, "nonfinite_loss"),
        (10, "nonfinite_loss"),
        (11, "nonfinite_loss"),
    ]
    assert overflow._after_loss(ds_engine.DeepSpeedEngine.backward, "retain_graph") is not None


def test_retain_graphs_place_is_found_across_deepspeed_signatures():
    from diag.collectors.overflow import _after_loss

    def old(self, loss, allreduce_gradients=True, release_loss=False, retain_graph=False):
        """DeepSpeed 0.9-0.14's backward."""

    def new(self, loss, retain_graph=False, scale_wrt_gas=True):
        """DeepSpeed 0.19's, behind a decorator that keeps it in its closure."""

    def decorated(*args, **kwargs):
        return new(*args, **kwargs)

    assert _after_loss(old, "retain_graph") == 2 and _after_loss(decorated, "retain_graph") == 0
    assert _after_loss(len, "retain_graph") is None
