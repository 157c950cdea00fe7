"""The project's vocabulary: canonical collective names and GPU kernel classes.

Every layer speaks it: the agent writes canonical op names, the importers map Kineto spellings onto
them, bus-bandwidth factors (`schema.bus_factor`) and the rules key on them, and the metrics split
activity by kernel class. Stdlib only, so the agent side can use it too.

Kernel classes follow Holistic Trace Analysis (hta/utils/utils.py) so that breakdown figures agree
on NCCL jobs: memory = `Memcpy*` / `Memset*` / `dma*` or a gpu_memcpy / gpu_memset event, other = a
name containing `Sync`, compute = everything else. Communication is wider than HTA's `^nccl.*kernel`:
`COMM_KERNELS` also holds RCCL, DeepEP (`internode::dispatch/combine/notify`, `intranode::...`, over
NVSHMEM) and NVSHMEM's own kernels, which HTA counts as compute (DeepSeek's DualPipe profile would be
"99.6% compute"). Users add their own with `DIAG_COMM_PATTERN` (one regex; `a|b` for several) or
`diag analyze --comm-pattern REGEX`.
"""

from __future__ import annotations

import functools
import os
import re
import signal

COMPUTE, COMM, MEMORY, OTHER = "compute", "comm", "memory", "other"

# Kernel-name patterns of the classes above (pandas `str.match` / `str.contains` patterns)
COMM_KERNEL_RE = r"(?i)^nccl.*kernel"  # HTA's communication class (NCCL, and RCCL: same kernel names)
# every communication kernel: (pattern searched in the kernel name, canonical op; None = the op is
# read from the NCCL kernel name or the host op that launched it)
COMM_KERNELS: tuple[tuple[str, str | None], ...] = (
    (r"^nccl.*kernel", None),  # NCCL ncclKernel_* / ncclDevKernel_*, RCCL on ROCm
    (r"^rccl", None),  # RCCL's own kernel names
    (r"\b(?:inter|intra)node(?:_ll)?::\w*(?:dispatch|combine|notify)", "all_to_all"),  # DeepEP
    (r"\bnvshmemi?_", None),  # NVSHMEM collectives / proxies
)
COMM_PATTERN_ENV = "DIAG_COMM_PATTERN"  # a user's regex of more communication kernels
UNKNOWN_OP = "unknown"  # a communication kernel whose collective nothing names
# the group of a profiler trace's collective whose process group it did not record (torch's record
# before `Process Group Name`, and gloo's annotations): one label for calls of possibly many groups
UNNAMED_GROUP = "default"
MEMORY_KERNEL_RE = r"(?i)^(memcpy|memset|dma)"
OTHER_KERNEL_RE = r"Sync"
MEMORY_KERNEL_CATS = ("gpu_memcpy", "gpu_memset")

# torch collective spellings -> one canonical op name (the keys of schema.bus_factor)
OPS = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_base": "all_gather",
    "allgather_coalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoallv": "all_to_all",
    "sendrecv": "send_recv",
    "broadcast": "broadcast",
    "barrier": "barrier",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
    # ProcessGroup / torch.distributed / deepspeed.comm spellings (one table for importers and rules)
    "all_gather_single": "all_gather",
    "all_gather_single_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_object": "all_gather",
    "all_reduce_coalesced": "all_reduce",
    "inference_all_reduce": "all_reduce",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "broadcast_object_list": "broadcast",
    "monitored_barrier": "barrier",
    "isend": "send",
    "irecv": "recv",
    "recvanysource": "recv",
    "recv_anysource": "recv",
    "batch_isend_irecv": "send_recv",
    # record_param_comms' "Collective name" of torch's all_to_all paths (ProcessGroupNCCL)
    "all_to_allv": "all_to_all",
    "alltoall_v": "all_to_all",
    "all_to_all_v": "all_to_all",
}
P2P = ("send", "recv", "send_recv")  # canonical point-to-point ops
CANONICAL_OPS = frozenset(OPS.values())
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


@functools.lru_cache(maxsize=8)
def _comm_re(user: str) -> re.Pattern[str]:
    parts = [p for p, _ in COMM_KERNELS] + ([f"(?:{user})"] if user else [])
    try:
        return re.compile("|".join(f"(?:{p})" for p in parts), re.IGNORECASE)
    except re.error as e:
        from diag.errors import DiagError

        raise DiagError(f"communication pattern {user!r} is not a regular expression ({e})") from None


def comm_kernel_re() -> re.Pattern[str]:
    """One case-insensitive regex (searched, not anchored) matching every communication kernel:
    `COMM_KERNELS` plus the user's `DIAG_COMM_PATTERN`, read at each call."""
    return _comm_re(os.environ.get(COMM_PATTERN_ENV, "").strip())


def check_comm_pattern(pattern: str) -> str:
    """`pattern` if it compiles; `DiagError` naming it otherwise (for the command line)."""
    _comm_re(pattern)
    return pattern


_FIXED_OPS = [(re.compile(p, re.IGNORECASE), op) for p, op in COMM_KERNELS if op]


def kernel_op(name: str) -> str:
    """The canonical op a communication kernel's own name tells (`ncclDevKernel_AllGather_*` ->
    all_gather, a DeepEP dispatch -> all_to_all), `UNKNOWN_OP` when it tells none (NCCL's
    `Generic` kernel, a user's pattern). NCCL runs all-to-all as grouped send/recv: its `SendRecv`
    kernel says send_recv, so prefer the host op that launched it (`host_comm_op`) when there is one."""
    m = _NCCL_OP_RE.match(name)
    if m:
        op = OPS.get(m.group(1).lower())
        return op or UNKNOWN_OP
    for rx, op in _FIXED_OPS:
        if rx.search(name):
            return op
    return UNKNOWN_OP


_HOST_COMM_RE = re.compile(r"^(?:c10d::|nccl:|gloo:|mpi:|ucc:)")


def host_comm_op(name: str) -> str | None:
    """The canonical op of a host-side collective op or annotation (`c10d::alltoall_base_`,
    `nccl:all_to_all`, `gloo:all_reduce`), None for any other host op or an unknown collective."""
    if not _HOST_COMM_RE.match(name):
        return None
    op = canonical_op(name)
    return op if op in CANONICAL_OPS else None


# how schedulers and users stop a job (scancel, a time limit, Ctrl-C): an exit by one of these, or an
# interrupt, is the job being stopped, not failing (the log importer and job_crash)
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


def ended_by(status: int) -> str:
    """A process' wait status as people name it: the signal that killed it ("SIGKILL"), or "exit
    code N" (the live looks read a dead rank's status while it is a zombie: `diag.live.looker`)."""
    sig = status & 0x7F
    if not sig:
        return f"exit code {(status >> 8) & 0xFF}"
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# what a rank raises when a peer's process is gone (gloo's "Read error ... Connection reset by peer"
# after a SIGKILL, NCCL's aborted communicator): a consequence of another rank's death, not a cause
PEER_LOST = (
    r"Connection (?:reset|closed) by peer|Broken pipe|ECONNRESET|remote process exited|"
    r"NCCL communicator was aborted|Connection refused"
)
