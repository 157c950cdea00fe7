"""Which `ProcessGroup` methods are collectives, what diag calls them, and how big their payload is.

Every torch.distributed function (and so DeepSpeed's TorchBackend and Megatron's mappings, which keep
references to those functions) ends in exactly one of these methods: measured in torch 2.13 with
gloo, including the coalescing manager (`allreduce_coalesced`, `all_gather_single_coalesced`,
`reduce_scatter_single_coalesced`), `*_into_tensor`, `batch_isend_irecv` and `*_object` helpers.
Not covered: `torch.distributed._functional_collectives` (c10d_functional ops: DTensor, FSDP2,
torch.compile), which neither DeepSpeed nor Megatron-core use.

Bytes follow nccl-tests' "size": all_reduce/broadcast/reduce/send/recv the tensor, all_gather the
output, reduce_scatter and all_to_all the input, gather/scatter one rank's piece times the group size;
coalesced calls sum their lists.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

_Tensor = torch.Tensor


class Spec(NamedTuple):
    """How to read one method's call: positions refer to the first (options) overload."""

    op: str  # canonical op name (schema bus factors key on it)
    arg: int | None  # positional index of the tensor(s) that define the payload; None: no payload
    times_n: bool  # payload is one rank's piece: multiply by the group size
    opts: int | None  # positional index of the *Options (asyncOp); None: no options
    p2p: bool  # send/recv: gloo's Work has no future, completion is seen at wait()


METHODS: dict[str, Spec] = {
    "allreduce": Spec("all_reduce", 0, False, 1, False),
    "allreduce_coalesced": Spec("all_reduce", 0, False, 1, False),
    "broadcast": Spec("broadcast", 0, False, 1, False),
    "reduce": Spec("reduce", 0, False, 1, False),
    "allgather": Spec("all_gather", 0, False, 2, False),
    "all_gather_single": Spec("all_gather", 0, False, 2, False),
    "_allgather_base": Spec("all_gather", 0, False, 2, False),
    "allgather_coalesced": Spec("all_gather", 0, False, 2, False),
    "all_gather_single_coalesced": Spec("all_gather", 0, False, 2, False),
    "allgather_into_tensor_coalesced": Spec("all_gather", 0, False, 2, False),
    "reduce_scatter": Spec("reduce_scatter", 1, False, 2, False),
    "reduce_scatter_single": Spec("reduce_scatter", 1, False, 2, False),
    "_reduce_scatter_base": Spec("reduce_scatter", 1, False, 2, False),
    "reduce_scatter_single_coalesced": Spec("reduce_scatter", 1, False, 2, False),
    "reduce_scatter_tensor_coalesced": Spec("reduce_scatter", 1, False, 2, False),
    "alltoall": Spec("all_to_all", 1, False, 2, False),
    "all_to_all_single": Spec("all_to_all", 1, False, 4, False),
    "alltoall_base": Spec("all_to_all", 1, False, 4, False),
    "gather": Spec("gather", 1, True, 2, False),
    "scatter": Spec("scatter", 0, True, 2, False),
    "send": Spec("send", 0, False, None, True),
    "recv": Spec("recv", 0, False, None, True),
    "recv_anysource": Spec("recv", 0, False, None, True),
    "barrier": Spec("barrier", None, False, 0, False),
    "monitored_barrier": Spec("barrier", None, False, None, False),
}

# keyword names pybind gives the payload arguments, by position (calls rarely use them)
_KW_NAMES = (
    ("tensors", "tensor", "output_tensors", "output_tensor", "output", "outputs", "output_lists"),
    ("input_tensors", "input_tensor", "input", "inputs", "input_list"),
)


def payload_arg(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The argument holding the payload tensor(s), positional or by keyword; None if absent."""
    i = spec.arg
    if i is None:
        return None
    if len(args) > i:
        return args[i]
    for name in _KW_NAMES[i]:
        if name in kwargs:
            return kwargs[name]
    return None


def call_payload(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, Any]:
    """(bytes, first tensor) of a call's payload, (0, None) without one: `payload(payload_arg())`
    in one call for the common cases, one tensor or a list of one (hooks run cold: each call counts)."""
    i = spec.arg
    x = args[i] if i is not None and len(args) > i else payload_arg(spec, args, kwargs)
    if type(x) is list and len(x) == 1:
        t = x[0]
        if isinstance(t, _Tensor):
            return t.nbytes, t
    elif isinstance(x, _Tensor):  # one tensor (all_gather_into_tensor): no `payload` call
        return x.nbytes, x
    return payload(x) if x is not None else (0, None)


def payload(x: Any) -> tuple[int, Any]:
    """(bytes, first tensor) of a tensor, a sequence of tensors, or a sequence of sequences."""
    if isinstance(x, _Tensor):
        return x.nbytes, x
    total, first = 0, None
    for item in x:
        if isinstance(item, _Tensor):
            total += item.nbytes
            if first is None:
                first = item
        else:
            n, t = payload(item)
            total += n
            if first is None:
                first = t
    return total, first


def is_async(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    """The caller's async_op as torch passes it in the options; None where this layer cannot tell
    (p2p: `send` and `isend` make the same call; overloads without options)."""
    i = spec.opts
    if i is None:
        return None
    opts = args[i] if len(args) > i else kwargs.get("opts")
    return getattr(opts, "asyncOp", None) if opts is not None else None


DTYPE_NAMES: dict[Any, str] = {}  # torch dtype -> its name, as records spell it


def dtype_name(tensor: Any) -> str | None:
    """'float32' for torch.float32; cached so the hot path formats no strings."""
    if tensor is None:
        return None
    dt = tensor.dtype
    name = DTYPE_NAMES.get(dt)
    if name is None:
        name = DTYPE_NAMES[dt] = str(dt).removeprefix("torch.")
    return name
