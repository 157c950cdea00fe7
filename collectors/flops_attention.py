"""FLOP formulas of fused attention kernels (scaled_dot_product_attention's backends).

Forward: scores Q K^T and P V, 2*b*h*s_q*s_k*(d_qk + d_v). Backward: the kernels recompute the scores
from the saved log-sum-exp, then dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q:
2*b*h*s_q*s_k*(3*d_qk + 2*d_v). Heads are the query's (grouped-query attention broadcasts K/V).
The causal mask is not discounted, as torch's counter and Megatron's MFU formula do. The math
fallback needs no formula: it runs as bmm/matmul ops, which are counted.

`flops` registers these formulas (`register`) when it is imported; this module does not import it,
so the two form no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Shape = Sequence[int]


def attention_flops(b: int, h: int, s_q: int, s_k: int, d_qk: int, d_v: int, backward: bool) -> int:
    per_pair = (3 * d_qk + 2 * d_v) if backward else (d_qk + d_v)
    return 2 * b * h * s_q * s_k * per_pair


def _bhsd(q: Shape, k: Shape, v: Shape, backward: bool) -> int:
    """Inputs laid out (batch, heads, seq, dim): the scaled_dot_product_* ops."""
    return attention_flops(q[0], q[1], q[2], k[2], q[3], v[3], backward)


def _bshd(q: Shape, k: Shape, v: Shape, max_k: Any, backward: bool) -> int:
    """Inputs laid out (batch, seq, heads, dim), or varlen (tokens, heads, dim) with max_k an upper
    bound on each sequence's key length (reading the real lengths would synchronize the GPU)."""
    if len(q) == 3:
        return attention_flops(1, q[1], q[0], int(max_k), q[2], v[2], backward)
    return attention_flops(q[0], q[2], q[1], k[1], q[3], v[3], backward)


def sdpa_forward(q: Shape, k: Shape, v: Shape, *_args: Any, **_: Any) -> int:
    return _bhsd(q, k, v, backward=False)


def sdpa_backward(_grad_out: Shape, q: Shape, k: Shape, v: Shape, *_args: Any, **_: Any) -> int:
    return _bhsd(q, k, v, backward=True)


def _max_k(args: tuple[Any, ...], index: int) -> Any:
    return args[index] if len(args) > index and args[index] is not None else 0


def flash_forward(q: Shape, k: Shape, v: Shape, *args: Any, **_: Any) -> int:
    # args: cum_seq_q, cum_seq_k, max_q, max_k, ...
    return _bshd(q, k, v, _max_k(args, 3), backward=False)


def efficient_forward(q: Shape, k: Shape, v: Shape, *args: Any, **_: Any) -> int:
    # args: bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...
    return _bshd(q, k, v, _max_k(args, 4), backward=False)


def flash_backward(_grad_out: Shape, q: Shape, k: Shape, v: Shape, *args: Any, **_: Any) -> int:
    # args: (out, logsumexp | bias, out), cum_seq_q, cum_seq_k, max_q, max_k, ...
    return _bshd(q, k, v, _max_k(args, 5), backward=True)


# op names -> formula; `flops` registers them for the packets this torch build has
FORMULAS: tuple[tuple[tuple[str, ...], Callable[..., int]], ...] = (
    (
        (
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable",
        ),
        sdpa_forward,
    ),
    (
        (
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention_backward",
            "_scaled_dot_product_cudnn_attention_backward",
            "_scaled_dot_product_fused_attention_overrideable_backward",
        ),
        sdpa_backward,
    ),
    (("_flash_attention_forward",), flash_forward),
    (("_efficient_attention_forward",), efficient_forward),
    (("_flash_attention_backward", "_efficient_attention_backward"), flash_backward),
)


def register(formula: Callable[..., Any], ops: Callable[..., list[Any]]) -> None:
    """Register every formula above with `flops.formula` for the op packets `flops.ops` finds."""
    for names, fn in FORMULAS:
        formula(*ops(*names))(fn)
