"""Real 2-rank training runs shared by the integration tests: each distinct command runs once per
session (the runs are the expensive part; many assertions read the same run)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from diag import load
from diag.trace.model import Trace
from tests.workloads import launch

GPT = "tests.workloads.gpt_ds"
MEGATRON = "tests.workloads.megatron_tp"
DDP = "tests.workloads.ddp"
# test_agent_deepspeed's ZeRO-2 fp16 run (one forced overflow, on rank 1, skipped on both ranks), also
# test_agent_robustness's: its run without the agent is shared through the cache
ZERO2_FP16 = ["--zero", "2", "--dtype", "fp16", "--overflow-at", "2", "--overflow-rank", "1"]
DS_STEPS = 4
DS_COMMON = ["--steps", str(DS_STEPS), "--layers-every", "1", "--truth", "--comms-logger"]


@dataclass
class Job:
    """One finished run: the workload's own result file, its output, and the diag trace if any."""

    result: dict[str, Any]
    output: str
    trace_dir: str | None
    _trace: Trace | None = field(default=None, repr=False)

    @property
    def trace(self) -> Trace:
        assert self.trace_dir is not None, "this run had no agent"
        if self._trace is None:
            self._trace = load(self.trace_dir)
        return self._trace

    def rank(self, r: int) -> dict[str, Any]:
        return self.result["ranks"][r]


class Runs:
    """Cache of runs keyed by (module, args, diag, env, under_run)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._done: dict[tuple[Any, ...], Job] = {}
        self._failed: dict[tuple[Any, ...], Exception] = {}  # a failed run fails its tests once each,
        self._attempts = 0  # not by rerunning for every test

    def get(
        self,
        module: str,
        args: list[str],
        diag: bool = True,
        env: dict[str, str] | None = None,
        under_run: bool = False,
    ) -> Job:
        """The run, from the cache or launched now. diag: the agent in every rank, started by the
        workload's `--diag` (after its process group), or with `under_run` by `diag run` (preloaded)."""
        key = (module, tuple(args), diag, tuple(sorted((env or {}).items())), under_run)
        if key in self._failed:
            raise self._failed[key]
        if key not in self._done:
            self._attempts += 1
            try:
                self._done[key] = self._run(module, args, diag, env, under_run, self._attempts)
            except Exception as exc:
                self._failed[key] = exc
                raise
        return self._done[key]

    def _run(
        self, module: str, args: list[str], diag: bool, env: dict[str, str] | None, under_run: bool, n: int
    ) -> Job:
        folder = os.path.join(self.root, f"run{n}")
        os.makedirs(folder)
        out = os.path.join(folder, "result.json")
        trace_dir = os.path.join(folder, "trace") if diag else None
        extra = ["--diag", "--trace-dir", trace_dir] if trace_dir and not under_run else []
        preload = trace_dir if under_run else None
        proc = launch.run(module, [*args, "--out", out, *extra], env=env, diag_run=preload)
        with open(out) as f:
            result = json.load(f)
        return Job(result, proc.stdout + proc.stderr, trace_dir)
