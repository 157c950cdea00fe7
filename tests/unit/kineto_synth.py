"""Small Kineto traces written by the tests themselves: kernels with their launches, host ops and
ProfilerSteps, in the shape torch.profiler writes (times in microseconds), for cases the committed
samples do not hold (DeepEP kernels, torchrec all-to-all, two runs, old formats)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Kineto:
    rank: int = 0
    world: int | None = 2
    t0: float = 1.7e15  # epoch microseconds, as torch writes them
    events: list[dict[str, Any]] = field(default_factory=list)
    _corr: int = 0

    def host(
        self,
        name: str,
        ts: float,
        dur: float,
        args: dict[str, Any] | None = None,
        cat: str = "cpu_op",
        tid: int = 1,
    ) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 1,
                "tid": tid,
                "ts": self.t0 + ts,
                "dur": dur,
                "args": args or {},
            }
        )

    def kernel(
        self, name: str, ts: float, dur: float, launch: float, launch_dur: float = 5.0, stream: int = 7
    ) -> None:
        """A kernel on the GPU at `ts` launched by a cudaLaunchKernel at `launch` (times in us)."""
        self._corr += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": self.t0 + ts,
                "dur": dur,
                "args": {"correlation": self._corr, "stream": stream, "device": 0},
            }
        )
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": self.t0 + launch,
                "dur": launch_dur,
                "args": {"correlation": self._corr},
            }
        )

    def step(self, n: int, ts: float, dur: float) -> None:
        self.host(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def doc(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schemaVersion": 1, "traceEvents": self.events}
        if self.world is not None:
            d["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": self.world}
        return d

    def write(self, path: Any) -> str:
        with open(path, "w") as f:
            json.dump(self.doc(), f, indent=1)
        return str(path)
