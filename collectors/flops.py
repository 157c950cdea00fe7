"""FLOP formulas: pure functions of shapes, one per aten op, registered with a decorator that refuses
duplicates (the model is torch/utils/flop_counter.py).

A FLOP is one multiply or one add: a (m x k) @ (k x n) product is 2*m*k*n. Bias adds, activations and
norms are not counted (they are memory bound; torch and Megatron's MFU count the same way).
Backward is counted from the ops that really run: a Linear whose input needs no gradient runs only
the weight-gradient matmul, so its backward is 1x its forward, not the usual 2x.
`linear` and `matmul` normally reach a dispatch mode already decomposed into mm/addmm/bmm; their
formulas serve the paths (inference mode) where they arrive whole. Attention is in flops_attention.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import torch

Shape = Sequence[int]
FORMULAS: dict[Any, Callable[..., int]] = {}
_aten = torch.ops.aten


def ops(*names: str) -> list[Any]:
    """The aten op packets of these names that this torch build has (some are CUDA-only builds')."""
    return [getattr(_aten, n) for n in names if hasattr(_aten, n)]


def formula(*targets: Any) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Register `fn(*shapes, out_shape=...)` for each op packet in `targets`; a second one is an error."""

    def register(fn: Callable[..., int]) -> Callable[..., int]:
        for target in targets:
            if target in FORMULAS:
                raise RuntimeError(f"duplicate FLOP formula for {target}")
            FORMULAS[target] = fn
        return fn

    return register


def _shape(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor | None):
        return [None if v is None else tuple(v.shape) for v in value]
    return value


def count(packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """FLOPs of one executed op (0 when no formula is registered)."""
    fn = FORMULAS.get(packet)
    if fn is None:
        return 0
    return fn(*map(_shape, args), out_shape=_shape(out), **{k: _shape(v) for k, v in kwargs.items()})


# ---- matrix products -------------------------------------------------------------------------
def mm_flops(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


@formula(*ops("mm"))
def mm(a: Shape, b: Shape, **_: Any) -> int:
    return mm_flops(a[0], a[1], b[1])


@formula(*ops("addmm", "_addmm_activation"))
def addmm(_bias: Shape, a: Shape, b: Shape, *_args: Any, **_: Any) -> int:
    return mm_flops(a[0], a[1], b[1])


@formula(*ops("bmm"))
def bmm(a: Shape, b: Shape, **_: Any) -> int:
    return a[0] * mm_flops(a[1], a[2], b[2])


@formula(*ops("baddbmm"))
def baddbmm(_self: Shape, a: Shape, b: Shape, *_args: Any, **_: Any) -> int:
    return bmm(a, b)


@formula(*ops("mv"))
def mv(a: Shape, _v: Shape, **_: Any) -> int:
    return mm_flops(a[0], a[1], 1)


@formula(*ops("addmv"))
def addmv(_self: Shape, a: Shape, v: Shape, *_args: Any, **_: Any) -> int:
    return mv(a, v)


@formula(*ops("matmul"))
def matmul(a: Shape, b: Shape, **_: Any) -> int:
    """torch.matmul with 1-D operands and broadcast batch dimensions."""
    a2 = (1, a[0]) if len(a) == 1 else a
    b2 = (b[0], 1) if len(b) == 1 else b
    batch = torch.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2]))
    return int(prod(batch)) * mm_flops(a2[-2], a2[-1], b2[-1])


@formula(*ops("linear"))
def linear(x: Shape, w: Shape, *_args: Any, **_: Any) -> int:
    return prod(x[:-1]) * mm_flops(1, w[1], w[0])


# ---- convolution ---------------------------------------------------------------------------------
def conv_flops(x: Shape, w: Shape, out: Shape, transposed: bool) -> int:
    """2 * batch * (output positions, input positions when transposed) * prod(weight shape).

    The weight holds c_out * c_in/groups * kernel values, so grouped convolutions are exact.
    """
    positions = prod((x if transposed else out)[2:])
    return 2 * x[0] * positions * prod(w)


@formula(
    *ops(
        "convolution", "_convolution", "cudnn_convolution", "_slow_conv2d_forward", "convolution_overrideable"
    )
)
def convolution(
    x: Shape,
    w: Shape,
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: Any = False,
    *_args: Any,
    out_shape: Shape,
    **_: Any,
) -> int:
    if not isinstance(transposed, bool):  # _slow_conv2d_forward has no `transposed` argument
        transposed = False
    return conv_flops(x, w, out_shape, transposed)


@formula(*ops("convolution_backward"))
def convolution_backward(
    grad_out: Shape,
    x: Shape,
    w: Shape,
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _out_pad: Any,
    _groups: int,
    output_mask: Sequence[bool],
    **_: Any,
) -> int:
    """grad-input and grad-weight each cost what the forward did; only the requested ones run."""
    one = conv_flops(x, w, grad_out, transposed)
    return one * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


# ---- embedding: a gather (and a scatter-add backward), 0 FLOPs but listed so it shows ------------
@formula(*ops("embedding", "embedding_dense_backward", "_embedding_bag"))
def embedding(*_args: Any, **_: Any) -> int:
    return 0


from diag.collectors import flops_attention  # noqa: E402 - after `formula` and `ops` exist

flops_attention.register(formula, ops)
