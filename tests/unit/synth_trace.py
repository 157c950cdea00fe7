"""Build small diag traces for rule unit tests: real trace files, loaded by the real reader.

A `Job` lays steps out on a wall clock per rank and places collectives inside them; tests change one
thing (a slow rank, a gap, an overflow) and check that exactly the matching rule reacts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import diag
from diag import schema
from diag.trace.model import Trace

MS = 1_000_000
T0 = 1_700_000_000 * 10**9


@dataclass
class Job:
    ranks: int = 2
    steps: int = 8
    step_ms: float = 100.0
    gap_ms: float = 1.0
    header: dict[str, Any] = field(default_factory=lambda: {"zero_stage": 0, "dtype": "fp32"})
    hosts: list[str] | None = None
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def start(self, rank: int, step: int) -> int:
        return T0 + int(step * (self.step_ms + self.gap_ms) * MS)

    def add(self, rank: int, kind: str, **fields: Any) -> None:
        rec = {"k": kind, **{f: schema.DEFAULTS.get(f) for f in schema.FIELDS[kind]}, **fields}
        if kind == schema.COMM:
            rec["algbw"], rec["busbw"] = schema.bandwidths(
                rec["op"], rec["bytes"] or 0, rec["dur"] or 0, rec["group_size"] or 0
            )
        self.events.setdefault(rank, []).append(rec)

    def comm(
        self,
        rank: int,
        step: int,
        op: str = "all_reduce",
        nbytes: int = 1 << 20,
        at_ms: float = 50,
        dur_ms: float = 5,
        module: str | None = "blocks.0",
        group_ranks: list[int] | None = None,
        async_op: bool = False,
        group: str = "world",
    ) -> None:
        ranks = group_ranks or list(range(self.ranks))
        self.add(
            rank,
            schema.COMM,
            step=step,
            op=op,
            bytes=nbytes,
            dtype="float32",
            group=group,
            group_size=len(ranks),
            group_ranks=ranks,
            ts=self.start(rank, step) + int(at_ms * MS),
            dur=int(dur_ms * MS),
            module=module,
            async_op=async_op,
        )

    def each_step(self, fn: Any) -> None:
        for r in range(self.ranks):
            for s in range(self.steps):
                fn(r, s)

    def write(self, path: str, step_ms: dict[int, float] | None = None) -> Trace:
        os.makedirs(path, exist_ok=True)
        for r in range(self.ranks):
            host = self.hosts[r] if self.hosts else "node0"
            header = {
                "k": "header",
                "schema": 1,
                "rank": r,
                "world_size": self.ranks,
                "host": host,
                "pid": 1000 + r,
                **self.header,
            }
            dur = (step_ms or {}).get(r, self.step_ms)
            steps = [
                {
                    "k": "step",
                    "step": s,
                    "ts": self.start(r, s),
                    "dur": int(dur * MS),
                    "samples": 8,
                    "tokens": None,
                    "applied": True,
                }
                for s in range(self.steps)
            ]
            with open(os.path.join(path, f"rank-{r:05d}.jsonl"), "w") as f:
                for obj in [header, *steps, *self.events.get(r, [])]:
                    f.write(json.dumps(obj) + "\n")
        return diag.load(path)


def write_capture(directory: str, capture: int, steps: int = 6) -> str:
    """One attach's trace of 2 ranks (`steps` steps, an all_reduce each) into `directory`, its files
    named as `writer.open_private` names the K-th capture's (`rank-N.K.jsonl`; K=0 `rank-N.jsonl`)."""
    job = Job(ranks=2, steps=steps)
    job.each_step(lambda r, s: job.comm(r, s))
    staged = f"{directory}.capture-{capture}"  # `write` loads what it wrote: a directory of its own
    job.write(staged)
    suffix = f".{capture}" if capture else ""
    os.makedirs(directory, exist_ok=True)
    for r in range(2):
        os.replace(
            os.path.join(staged, f"rank-{r:05d}.jsonl"),
            os.path.join(directory, f"rank-{r:05d}{suffix}.jsonl"),
        )
    return directory


def two_captures(directory: str, later_steps: int = 6) -> str:
    """A directory two attaches wrote into: a capture of 6 steps, then one of `later_steps`."""
    write_capture(directory, 0)
    return write_capture(directory, 1, later_steps)


def fired(trace: Trace, name: str) -> list[Any]:
    """Findings of one rule (through the registry, as `diag analyze` runs it)."""
    from diag.analyzers import registered_rules

    return registered_rules()[name][0](trace)
