"""Synthetic trace of a many-rank job, appended step by step: only for the 256-rank scale test
and bench/tui.py (a real 256-rank job does not fit this machine). Records follow diag.schema and
carry the busbw the agent would compute."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from diag import schema

MODULES = (
    "model.embedding.word_embeddings",
    "model.layers.0.attn",
    "model.layers.0.mlp",
    "model.layers.1.attn",
    "model.layers.1.mlp",
    "model.output_layer",
)


class SynthJob:
    def __init__(
        self,
        directory: str,
        ranks: int,
        per_host: int = 8,
        slow_rank: int | None = None,
        t0: int | None = None,
        overflow_at: int | None = None,
    ) -> None:
        os.makedirs(directory, exist_ok=True)
        self.dir, self.ranks, self.slow, self.overflow_at = directory, ranks, slow_rank, overflow_at
        self.t = time.time_ns() if t0 is None else t0
        self.files = []
        for r in range(ranks):
            f = open(os.path.join(directory, f"rank-{r:05d}.jsonl"), "a")
            f.write(
                json.dumps(
                    {
                        "k": "header",
                        "schema": 1,
                        "rank": r,
                        "world_size": ranks,
                        "host": f"node{r // per_host}",
                        "pid": 10000 + r,
                        "dp": ranks,
                        "zero_stage": 1,
                        "dtype": "bf16",
                    }
                )
                + "\n"
            )
            self.files.append(f)

    def step_records(self, r: int, step: int) -> list[dict[str, Any]]:
        dur = 100_000_000 + r * 10_000 + (60_000_000 if r == self.slow else 0)
        ts = self.t + step * 200_000_000
        nbytes, cdur = 50_000_000 + step, 20_000_000 + r * 1000
        alg, bus = schema.bandwidths("all_reduce", nbytes, cdur, self.ranks)
        recs = [
            {
                "k": "comm",
                "step": step,
                "op": "all_reduce",
                "bytes": nbytes,
                "dtype": "bf16",
                "group": "dp",
                "group_size": self.ranks,
                "ts": ts + 50_000_000,
                "dur": cdur,
                "module": None,
                "async_op": False,
                "algbw": alg,
                "busbw": bus,
            },
            {"k": "step", "step": step, "ts": ts, "dur": dur, "samples": 8, "tokens": 8192, "applied": True},
            {
                "k": "memory",
                "step": step,
                "ts": ts + dur,
                "device": "cuda:0",
                "allocated": 10 << 30,
                "reserved": 12 << 30,
                "peak": (20 << 30) + step * 1000 + r,
                "capacity": 80 << 30,
                "rss": 1 << 30,
            },
        ]
        hit = step == self.overflow_at
        scale = 65536.0 / (2 if self.overflow_at is not None and step > self.overflow_at else 1)
        recs.append(
            {
                "k": "overflow",
                "step": step,
                "ts": ts + dur,
                "overflow": hit,
                "scale_before": scale,
                "scale_after": scale / 2 if hit else scale,
                "skipped_steps": int(self.overflow_at is not None and step >= self.overflow_at),
                "source": "synthetic",
            }
        )
        if step % 2 == 0:
            for i, m in enumerate(MODULES):
                for phase in ("forward", "backward"):
                    recs.append(
                        {
                            "k": "layer",
                            "step": step,
                            "module": m,
                            "phase": phase,
                            "ts": ts + i,
                            "dur": 1_000_000 * (i + 1),
                            "flops": 10**9 * (i + 1),
                            "mem_delta": 0,
                        }
                    )
        return recs

    def write_step(self, step: int) -> None:
        for r, f in enumerate(self.files):
            f.write("".join(json.dumps(x) + "\n" for x in self.step_records(r, step)))
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
