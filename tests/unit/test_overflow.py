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
