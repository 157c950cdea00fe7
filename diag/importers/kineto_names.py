"""Names in PyTorch profiler (Kineto) traces: GPU kernel classes and canonical collective names.

Kernel classes follow Holistic Trace Analysis (hta/utils/utils.py) so that breakdown figures agree:
communication = `^nccl.*kernel` (old `ncclKernel_*` and new `ncclDevKernel_*`; we also accept any
case), memory = `Memcpy*` / `Memset*` / `dma*` or a gpu_memcpy / gpu_memset event, other = a name
containing `Sync`, compute = everything else.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

COMPUTE, COMM, MEMORY, OTHER = "compute", "comm", "memory", "other"

_COMM_RE = r"(?i)^nccl.*kernel"
_MEMORY_RE = r"(?i)^(memcpy|memset|dma)"
_OTHER_RE = r"Sync"

# torch collective spellings -> one canonical op name (the keys of schema.bus_factor)
_OPS = {
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
_NCCL_OP_RE = re.compile(r"(?i)^nccl(?:dev)?kernel_([a-z]+)")


def classify_kernels(names: pd.Series, cats: pd.Series) -> pd.Series:
    """One class per kernel (compute / comm / memory / other), vectorized over the names."""
    s = names.astype(str)
    out = np.full(len(s), COMPUTE, dtype=object)
    out[s.str.contains(_OTHER_RE, regex=True).to_numpy()] = OTHER
    mem = s.str.match(_MEMORY_RE).to_numpy() | cats.isin(["gpu_memcpy", "gpu_memset"]).to_numpy()
    out[mem] = MEMORY
    out[s.str.match(_COMM_RE).to_numpy()] = COMM
    return pd.Series(out, index=names.index, dtype="category")


def canonical_op(name: str) -> str:
    """`c10d::_allgather_base_`, `gloo:all_gather`, `ncclDevKernel_AllGather_RING_LL`,
    `all_gather_into_tensor` -> `all_gather`; unknown names come back lower-cased."""
    m = _NCCL_OP_RE.match(name)
    if m:
        key = m.group(1).lower()
    else:
        key = name.split(":")[-1].strip("_").lower()
    return _OPS.get(key, key)


_SIZE_WORDS = ((8, ("double", "float64", "long", "int64", "complex<float>")),
               (1, ("char", "int8", "uint8", "byte", "bool", "float8")),
               (2, ("half", "bfloat16", "float16", "short", "int16")),
               (4, ("float", "int", "uint32")))


def element_bytes(dtype: object) -> int:
    """Bytes per element of a Kineto / NCCL dtype string (`c10::Half`, `unsigned char`, `Float`,
    `BFloat16`, ...); 4 (fp32) when unknown or absent."""
    text = str(dtype).lower()
    for size, words in _SIZE_WORDS:
        if any(w in text for w in words):
            return size
    return 4
