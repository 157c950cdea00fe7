"""A fixed sequence of collectives run by each rank of a 3-process gloo group with the comms collector
on (`test_comms.py`). `EXPECTED` is what diag must record for it, written out by hand from the shapes:
16 B = four float32, so all_gather's output and reduce_scatter's input are 3 x 16 = 48 B."""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from tests.workloads import common

WORLD = 3
SLOW_RANK, SLOW_S = 1, 0.3  # rank 1 joins two all_reduces late: the others' dur shows it
W = (0, 1, 2)
S = (0, 2)  # the subgroup: global ranks 0 and 2
# (op, bytes, dtype, group ranks, async_op) per rank, in issue order; group size = len(ranks)
_COMMON = [
    ("all_reduce", 16, "float32", W, False),
    ("all_reduce", 16, "float32", W, True),
    ("all_gather", 48, "float32", W, False),
    ("all_gather", 48, "float32", W, False),
    ("reduce_scatter", 48, "float32", W, False),
    ("reduce_scatter", 48, "float32", W, False),
    ("all_reduce", 32, "float32", W, False),  # all_reduce_coalesced of two tensors
    ("all_gather", 72, "float32", W, False),  # all_gather_coalesced: 3 x (16 + 8)
    ("all_gather", 96, "float32", W, True),  # coalescing manager: two all_gather_into_tensor
    ("reduce_scatter", 96, "float32", W, False),  # coalescing manager: two reduce_scatter_tensor
    ("broadcast", 16, "float32", W, False),
    ("barrier", 0, None, W, False),
    ("barrier", 0, None, W, None),  # monitored_barrier (gloo only, blocking, no options)
    ("reduce", 16, "float32", W, False),
    ("gather", 48, "float32", W, False),
    ("scatter", 48, "float32", W, False),
    ("all_to_all", 48, "float32", W, False),  # all_to_all_single
    ("all_to_all", 48, "float32", W, False),  # all_to_all (lists)
    ("all_reduce", 8, "float64", W, False),
]
_P2P = {  # rank 0 -> 1 send/recv, then isend/irecv, then a batch_isend_irecv ring
    0: [("send", 16, "float32", W, None)] * 2,
    1: [("recv", 16, "float32", W, None)] * 2,
    2: [],
}
_RING = [("send", 16, "float32", W, None), ("recv", 16, "float32", W, None)]
_SUB = {0: [("all_reduce", 16, "float32", S, False)], 1: [], 2: [("all_reduce", 16, "float32", S, False)]}
EXPECTED = {r: [*_COMMON, *_P2P[r], *_RING, *_SUB[r]] for r in range(WORLD)}


def collectives(rank: int) -> None:
    t = torch.ones(4)
    z = torch.zeros
    for async_op in (False, True):
        if rank == SLOW_RANK:
            time.sleep(SLOW_S)
        work = dist.all_reduce(t, async_op=async_op)
        if work is not None:
            time.sleep(SLOW_S)  # overlap: the work completes while this rank does other things
            work.wait()
    dist.all_gather([z(4) for _ in range(WORLD)], t)
    dist.all_gather_into_tensor(z(12), t)
    dist.reduce_scatter_tensor(z(4), torch.ones(12))
    dist.reduce_scatter(z(4), [t.clone() for _ in range(WORLD)])
    dist.all_reduce_coalesced([t, t.clone()])
    dist.all_gather_coalesced([[z(4), z(2)] for _ in range(WORLD)], [t, torch.ones(2)])
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(z(12), t)
        dist.all_gather_into_tensor(z(12), t)
    cm.wait()
    with _coalescing_manager():
        dist.reduce_scatter_tensor(z(4), torch.ones(12))
        dist.reduce_scatter_tensor(z(4), torch.ones(12))
    dist.broadcast(t, 0)
    dist.barrier()
    dist.monitored_barrier()
    dist.reduce(t, 0)
    dist.gather(t, [z(4) for _ in range(WORLD)] if rank == 0 else None, 0)
    dist.scatter(z(4), [t.clone() for _ in range(WORLD)] if rank == 0 else None, 0)
    dist.all_to_all_single(z(12), torch.ones(12))
    dist.all_to_all([z(4) for _ in range(WORLD)], [t.clone() for _ in range(WORLD)])
    dist.all_reduce(torch.ones(1, dtype=torch.float64))
    p2p(rank, t)
    sub = dist.new_group(list(S))
    if rank in S:
        dist.all_reduce(t, group=sub)


def p2p(rank: int, t: torch.Tensor) -> None:
    if rank == 0:
        dist.send(t, 1)
        dist.isend(t, 1).wait()
    elif rank == 1:
        dist.recv(t, 0)
        dist.irecv(t, 0).wait()
    ops = [
        dist.P2POp(dist.isend, t, (rank + 1) % WORLD),
        dist.P2POp(dist.irecv, torch.zeros(4), (rank - 1) % WORLD),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def store_barrier() -> None:
    """Wait for every rank through the store: not a collective, so nothing is recorded."""
    store = dist.distributed_c10d._get_default_store()
    store.add("started", 1)
    while store.add("started", 0) < WORLD:
        time.sleep(0.001)


def failing_call() -> str:
    """A collective torch rejects: the same exception must reach the caller, and nothing recorded."""
    try:
        dist.all_gather_coalesced([[torch.zeros(4)]], [torch.ones(4)])
    except RuntimeError as e:
        return str(e)
    return "no error"


def run(rank: int, init: str, trace_dir: str, result_dir: str) -> None:
    """One rank: the sequence with the agent on; then checks that only this process can make."""
    from torch.distributed import ProcessGroup

    from diag import agent

    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    out: dict[str, Any] = {}
    try:
        before = dict(ProcessGroup.__dict__)
        bare_error = failing_call()
        agent.start(trace_dir, what=("comms",))
        wrapped = ProcessGroup.allreduce is not before["allreduce"]
        store_barrier()  # agent start-up times differ per rank: start the sequence together
        collectives(rank)
        out["error_same"] = failing_call() == bare_error and "allgather_coalesced" in bare_error
        agent.stop()
        out["wrapped"] = wrapped
        out["restored"] = [n for n, v in before.items() if ProcessGroup.__dict__.get(n) is not v]
        dist.barrier()
    except Exception:  # noqa: BLE001 - reported to the test through the result file
        out["exception"] = traceback.format_exc()
    finally:
        with open(os.path.join(result_dir, f"{rank}.txt"), "w") as f:
            f.write(repr(out))
        dist.destroy_process_group()
        common.exit_now()  # see common.finish: no interpreter finalization with gloo threads alive
