"""The project's vocabulary: canonical collective names and GPU kernel classes.

Every layer speaks it: the agent writes canonical op names, the importers map Kineto spellings onto
them, bus-bandwidth factors (`schema.bus_factor`) and the rules key on them, and the metrics split
activity by kernel class. Stdlib only, so the agent side can use it too.

Kernel classes follow Holistic Trace Analysis (hta/utils/utils.py) so that breakdown figures agree:
communication = `^nccl.*kernel` (old `ncclKernel_*` and new `ncclDevKernel_*`; we also accept any
case), memory = `Memcpy*` / `Memset*` / `dma*` or a gpu_memcpy / gpu_memset event, other = a name
containing `Sync`, compute = everything else.
"""

from __future__ import annotations

import re

COMPUTE, COMM, MEMORY, OTHER = "compute", "comm", "memory", "other"

# Kernel-name patterns of the classes above (pandas `str.match` / `str.contains` patterns)
COMM_KERNEL_RE = r"(?i)^nccl.*kernel"
MEMORY_KERNEL_RE = r"(?i)^(memcpy|memset|dma)"
OTHER_KERNEL_RE = r"Sync"
MEMORY_KERNEL_CATS = ("gpu_memcpy", "gpu_memset")

# torch collective spellings -> one canonical op name (the keys of schema.bus_factor)
OPS = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_base": "all_gather", "allgather_coalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all", "alltoallv": "all_to_all", "sendrecv": "send_recv",
    "broadcast": "broadcast", "barrier": "barrier", "reduce": "reduce", "gather": "gather",
    "scatter": "scatter", "send": "send", "recv": "recv", "recv_any_source": "recv",
    # ProcessGroup / torch.distributed / deepspeed.comm spellings (one table for importers and rules)
    "all_gather_single": "all_gather", "all_gather_single_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "all_gather_object": "all_gather",
    "all_reduce_coalesced": "all_reduce", "inference_all_reduce": "all_reduce",
    "reduce_scatter_single": "reduce_scatter", "reduce_scatter_single_coalesced": "reduce_scatter",
    "broadcast_object_list": "broadcast", "monitored_barrier": "barrier", "isend": "send",
    "irecv": "recv", "recvanysource": "recv", "recv_anysource": "recv", "batch_isend_irecv": "send_recv",
}
P2P = ("send", "recv", "send_recv")  # canonical point-to-point ops
_NCCL_OP_RE = re.compile(r"(?i)^nccl(?:dev)?kernel_([a-z]+)")


def canonical_op(name: str) -> str:
    """`c10d::_allgather_base_`, `gloo:all_gather`, `ncclDevKernel_AllGather_RING_LL`,
    `all_gather_into_tensor` -> `all_gather`; unknown names come back lower-cased."""
    m = _NCCL_OP_RE.match(name)
    if m:
        key = m.group(1).lower()
    else:
        key = name.split(":")[-1].strip("_").lower()
    return OPS.get(key, key)
