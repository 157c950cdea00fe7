"""FLOP formulas and the counting dispatch mode, checked on real torch ops: exact counts from shapes,
backward counted from the ops that really run, and agreement with torch's own FlopCounterMode where
it is right (it misses CPU flash attention, which we count)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from diag.collectors import flops, flops_attention
from diag.collectors.layers import FlopMode
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


def counted(fn: Callable[[], object]) -> int:
    mode = FlopMode(None)
    with mode:
        fn()
    return mode.total


def torch_counted(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("input_grad", [True, False])
def test_linear_forward_and_exact_backward(input_grad: bool) -> None:
    m, k, n = 6, 5, 3  # x: (2, 3, 5) -> M = 6 rows
    lin = torch.nn.Linear(k, n)
    x = torch.randn(2, 3, k, requires_grad=input_grad)
    out = {}

    def fwd() -> None:
        out["y"] = lin(x)

    assert counted(fwd) == 2 * m * n * k
    grad_only_weight = 2 * m * n * k
    expected = grad_only_weight + (2 * m * n * k if input_grad else 0)
    assert counted(lambda: out["y"].sum().backward()) == expected


def test_bmm_baddbmm_matmul_and_mm() -> None:
    a, b, c = torch.randn(4, 3, 5), torch.randn(4, 5, 2), torch.randn(4, 3, 2)
    assert counted(lambda: torch.baddbmm(c, a, b)) == 2 * 4 * 3 * 5 * 2
    assert counted(lambda: torch.bmm(a, b)) == 2 * 4 * 3 * 5 * 2
    assert counted(lambda: torch.mm(a[0], b[0])) == 2 * 3 * 5 * 2
    assert counted(lambda: torch.matmul(torch.randn(7, 1, 3, 5), b)) == 2 * 28 * 3 * 5 * 2
    # the whole-op formulas (they arrive whole only in some modes) agree with the decomposed count
    assert flops.matmul((7, 1, 3, 5), (4, 5, 2)) == 2 * 28 * 3 * 5 * 2
    assert flops.matmul((5,), (5, 2)) == 2 * 5 * 2
    assert flops.linear((2, 3, 5), (4, 5)) == 2 * 6 * 5 * 4


@pytest.mark.parametrize("groups,transposed", [(1, False), (2, False), (1, True)])
def test_conv_forward_and_backward(groups: int, transposed: bool) -> None:
    cls = torch.nn.ConvTranspose2d if transposed else torch.nn.Conv2d
    conv = cls(4, 6, kernel_size=3, padding=1, groups=groups, bias=False)
    x = torch.randn(2, 4, 5, 5)
    positions = 2 * 5 * 5  # batch * spatial (same padding: output == input size)
    fwd = 2 * positions * 6 * (4 // groups) * 9
    y = {}

    def run() -> None:
        y["y"] = conv(x)

    assert counted(run) == fwd
    assert counted(lambda: y["y"].sum().backward()) == fwd  # input needs no grad: weight grad only
    x.requires_grad_(True)
    assert counted(lambda: conv(x).sum().backward()) == 3 * fwd
    if groups == 1 and not transposed:
        assert torch_counted(lambda: conv(x).sum().backward()) == 3 * fwd


def test_cpu_flash_attention_counted_forward_and_backward() -> None:
    b, h, s, d = 2, 3, 8, 4
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    seen: set[str] = set()

    class Spy(FlopMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            seen.add(str(func._overloadpacket))
            return super().__torch_dispatch__(func, types, args, kwargs)

    mode, out = Spy(None), {}
    with mode:
        out["o"] = F.scaled_dot_product_attention(q, k, v)
    assert any("_scaled_dot_product_flash_attention_for_cpu" in op for op in seen)
    assert mode.total == 4 * b * h * s * s * d
    # same as the attention written out with two matmuls
    assert counted(lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ v) == mode.total
    with mode:
        out["o"].sum().backward()
    assert mode.total - 4 * b * h * s * s * d == 10 * b * h * s * s * d
    assert torch_counted(lambda: F.scaled_dot_product_attention(q, k, v)) == 0  # torch misses it


def test_attention_formulas_layouts_and_gqa() -> None:
    # (b, h, s, d) ops; grouped-query attention counts the query's heads
    assert flops_attention.sdpa_forward(
        (2, 8, 16, 4), (2, 2, 32, 4), (2, 2, 32, 6)
    ) == 2 * 2 * 8 * 16 * 32 * (4 + 6)
    assert flops_attention.sdpa_backward(
        (2, 8, 16, 6), (2, 8, 16, 4), (2, 2, 32, 4), (2, 2, 32, 6)
    ) == 2 * 2 * 8 * 16 * 32 * (3 * 4 + 2 * 6)
    # flash kernels take (b, s, h, d); varlen (tokens, h, d) is bounded by max_k
    assert (
        flops_attention.flash_forward((2, 16, 8, 4), (2, 32, 8, 4), (2, 32, 8, 4), None, None, 16, 32)
        == 2 * 2 * 8 * 16 * 32 * 8
    )
    assert (
        flops_attention.flash_forward((10, 8, 4), (10, 8, 4), (10, 8, 4), None, None, 6, 6)
        == 2 * 8 * 10 * 6 * 8
    )


def test_embedding_is_listed_with_zero_flops() -> None:
    emb = torch.nn.Embedding(10, 4)
    ids = torch.randint(0, 10, (3, 5))
    assert aten.embedding in flops.FORMULAS and aten.embedding_dense_backward in flops.FORMULAS
    assert counted(lambda: emb(ids).sum().backward()) == 0


def test_duplicate_registration_is_refused() -> None:
    with pytest.raises(RuntimeError, match="duplicate"):
        flops.formula(aten.mm)(lambda *a, **k: 0)
    assert flops.FORMULAS[aten.mm] is flops.mm


def test_agrees_with_flop_counter_mode_on_an_mlp() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16, requires_grad=True)

    def step() -> None:
        model(x).pow(2).sum().backward()

    assert counted(step) == torch_counted(step) == 3 * 2 * 4 * (16 * 32 + 32 * 8)
