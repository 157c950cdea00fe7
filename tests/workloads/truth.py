"""Ground truth taken independently of diag's collectors: torch.profiler's `c10d::` dispatcher ops
(every collective a ProcessGroup runs, whoever called it) with their input shapes and dtypes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from torch.profiler import ProfilerActivity, profile, schedule

_DTYPE_BYTES = {
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "double": 8,
    "long int": 8,
    "int": 4,
    "unsigned char": 1,
    "bool": 1,
    "signed char": 1,
    "short int": 2,
}


class CollectiveCounter:
    """After the block: `counts[op]` and `bytes[op]` of the first tensor argument. The profiler records
    no shapes for tensor-list arguments (allreduce_, broadcast_, allgather_): their ops are listed in
    `unsized` and their bytes are left out (DeepSpeed's comms logger gives those, see `ds_comms`)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.bytes_arg1: dict[str, int] = {}  # the second tensor (input of *_base_ ops)
        self.unsized: set[str] = set()

    def read(self, prof: Any) -> None:
        for ev in (e for e in prof.events() if e.name.startswith("c10d::")):
            op = ev.name[len("c10d::") :]
            self.counts[op] = self.counts.get(op, 0) + 1
            shapes, types = ev.input_shapes or [], getattr(ev, "input_dtypes", None) or []
            n = _nbytes(shapes[:1], types[:1])
            if n is None:
                self.unsized.add(op)
                continue
            self.bytes[op] = self.bytes.get(op, 0) + n
            self.bytes_arg1[op] = self.bytes_arg1.get(op, 0) + (_nbytes(shapes[1:2], types[1:2]) or 0)

    def step(self) -> None:
        """Same interface as a scheduled profiler; the count covers every step."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "bytes": self.bytes,
            "bytes_arg1": self.bytes_arg1,
            "unsized": sorted(self.unsized),
        }


def _nbytes(shapes: list[Any], types: list[Any]) -> int | None:
    """Bytes of the first argument when it is one tensor of a known dtype (else None)."""
    if not shapes or not types or types[0] not in _DTYPE_BYTES:
        return None
    return _numel(shapes[0]) * _DTYPE_BYTES[types[0]]


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


@contextlib.contextmanager
def collectives() -> Iterator[CollectiveCounter]:
    counter = CollectiveCounter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        yield counter
    counter.read(prof)


@contextlib.contextmanager
def kineto(folder: str, rank: int) -> Iterator[Any]:
    """A few steps under a schedule (wait 1, warmup 1, active 2); the loop calls `prof.step()`."""
    os.makedirs(folder, exist_ok=True)

    def export(prof: Any) -> None:
        prof.export_chrome_trace(os.path.join(folder, f"rank{rank}.pt.trace.json"))

    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=export,
    ) as prof:
        yield prof
