"""Write the small reproductions of issue 11's false alarms and wrong fixes, each in its own folder
`sample_traces/repro_<case>/` with a `labels.toml` (what the rules must and must not flag), for the
labeled evaluation `python -m bench.rules`.

    python -m sample_traces.generate_repros

These are synthetic diag traces (2 ranks, 8 steps of 100 ms laid out on a clock, collectives placed
inside them), not runs: each isolates one premise a rule got wrong (collectives counted as input
stall, unknown sizes counted as tiny, reserved memory against the allocation after the step) or one
framework whose flags a rule named wrongly (Megatron-DeepSpeed given Megatron-LM flags).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MS = 1_000_000
T0 = 1_700_000_000 * 10**9
GIB = 2**30
MDS_ARGV = ["pretrain_gpt.py", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
            "--num-layers", "2", "--micro-batch-size", "4", "--deepspeed", "--deepspeed_config", "ds.json"]
MLM_ARGV = ["pretrain_gpt.py", "--tensor-model-parallel-size", "2", "--num-layers", "4",
            "--micro-batch-size", "4", "--global-batch-size", "8"]


class Repro:
    def __init__(self, header: dict[str, Any], step_ms: float = 100.0, gap_ms: float = 1.0, steps: int = 8):
        self.header, self.step_ms, self.gap_ms, self.steps = header, step_ms, gap_ms, steps
        self.events: dict[int, list[dict[str, Any]]] = {0: [], 1: []}

    def start(self, step: int) -> int:
        return T0 + int(step * (self.step_ms + self.gap_ms) * MS)

    def comm(self, rank: int, step: int, at_ms: float, dur_ms: float, nbytes: int | None,
             op: str = "all_reduce", group_ranks: list[int] | None = None) -> None:
        self.events[rank].append({
            "k": "comm", "step": step, "op": op, "bytes": nbytes, "dtype": "float32", "group": "world",
            "group_size": len(group_ranks or [0, 1]), "group_ranks": group_ranks or [0, 1],
            "ts": self.start(step) + int(at_ms * MS), "dur": int(dur_ms * MS), "module": None,
            "async_op": False, "algbw": None, "busbw": None})

    def memory(self, rank: int, step: int, allocated: float, reserved: float, peak: float, cap: float) -> None:
        self.events[rank].append({"k": "memory", "step": step, "ts": self.start(step) + 99 * MS,
                                  "device": "cuda:0", "allocated": int(allocated), "reserved": int(reserved),
                                  "peak": int(peak), "capacity": cap, "rss": None, "module": None})

    def write(self, folder: str, labels: dict[str, Any]) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for r in (0, 1):
            head = {"k": "header", "schema": 1, "rank": r, "world_size": 2, "host": "node0", "pid": 100 + r,
                    "start_ts": T0, **self.header}
            steps = [{"k": "step", "step": s, "ts": self.start(s), "dur": int(self.step_ms * MS),
                      "samples": 8, "tokens": None, "applied": True} for s in range(self.steps)]
            with open(os.path.join(folder, f"rank-{r:05d}.jsonl"), "w") as f:
                for obj in [head, *steps, *self.events[r]]:
                    f.write(json.dumps(obj) + "\n")
        with open(os.path.join(folder, "labels.toml"), "w") as f:
            f.write(labels_toml(labels))


def labels_toml(labels: dict[str, Any]) -> str:
    """The labels as TOML (a `.json` file in a trace folder would be read as a Kineto trace)."""
    lines = [f"{k} = {json.dumps(labels[k])}" for k in ("why", "must_flag", "must_not_flag")]
    if labels.get("known_misses"):
        lines += ["", "[known_misses]", *(f"{k} = {json.dumps(v)}" for k, v in labels["known_misses"].items())]
    return "\n".join(lines) + "\n"


def each(job: Repro, fn: Any) -> None:
    for r in (0, 1):
        for s in range(job.steps):
            fn(r, s)


def cases() -> dict[str, tuple[Repro, dict[str, Any]]]:
    ds = {"zero_stage": 1, "dtype": "bf16", "deepspeed": "0.19.8",
          "ds_config": {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                        "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}}
    out: dict[str, tuple[Repro, dict[str, Any]]] = {}

    idle = Repro(ds, gap_ms=40)  # the 40 ms between steps is a gradient all-reduce, not the loader
    each(idle, lambda r, s: idle.comm(r, s, at_ms=100.5, dur_ms=39, nbytes=64 << 20))
    out["repro_idle_is_collectives"] = (idle, {
        "why": "the idle time between steps is spent in all_reduce: no input stall",
        "must_flag": [], "must_not_flag": ["idle_between_steps"]})

    nosize = Repro({"argv": ["train.py"]})  # a trace without size fields: 40 ops of unknown size
    each(nosize, lambda r, s: [nosize.comm(r, s, at_ms=10 + i, dur_ms=0.5, nbytes=0) for i in range(40)])
    out["repro_sizes_unknown"] = (nosize, {
        "why": "collective sizes were not recorded: 'tiny' is not measured",
        "must_flag": [], "must_not_flag": ["*"]})

    tiny = Repro(ds)
    each(tiny, lambda r, s: [tiny.comm(r, s, at_ms=10 + i, dur_ms=0.5, nbytes=4096) for i in range(40)])
    out["repro_tiny_collectives"] = (tiny, {
        "why": "40 all-reduces of 4 KiB per step take 20% of it",
        "must_flag": ["tiny_collectives"], "must_not_flag": ["*"]})

    frag = Repro(ds)  # reserved 14 GiB, 3.3 GiB after the iteration, 12 GiB at the peak: 1.17x
    each(frag, lambda r, s: frag.memory(r, s, 3.3 * GIB, 14 * GIB, 12 * GIB, 80 * GIB))
    out["repro_reserved_vs_peak"] = (frag, {
        "why": "reserved is 1.17x the max allocated: no fragmentation (the allocation after the step is "
               "not the premise)",
        "must_flag": [], "must_not_flag": ["*"]})

    full = Repro(ds)
    each(full, lambda r, s: full.memory(r, s, 70 * GIB, 76 * GIB, 75 * GIB, 80 * GIB))
    out["repro_memory_near_capacity"] = (full, {
        "why": "the peak allocation is 94% of the device", "must_flag": ["memory_pressure"],
        "must_not_flag": ["*"]})

    mds = {"argv": MDS_ARGV, "pp": 2, "zero_stage": 1, "gradient_accumulation_steps": 1, "deepspeed": "0.15.0",
           "ds_config": {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                         "zero_optimization": {"stage": 1}}}
    pipe = Repro(mds)
    each(pipe, lambda r, s: pipe.comm(r, s, at_ms=20, dur_ms=50, nbytes=1 << 20, op="send" if r == 0 else "recv"))
    out["repro_mds_pipeline_bubble"] = (pipe, {
        "why": "Megatron-DeepSpeed, 2 stages, 1 microbatch: the bubble must be flagged with DeepSpeed's "
               "gradient_accumulation_steps, never Megatron-LM's interleaving or stage-balancing flags",
        "must_flag": ["pipeline_bubble"], "must_not_flag": ["*"]})

    mlm = Repro({"argv": MLM_ARGV, "tp": 2})
    each(mlm, lambda r, s: [mlm.comm(r, s, at_ms=20 + 20 * i, dur_ms=3, nbytes=8 << 20) for i in range(4)])
    out["repro_megatron_lm_healthy"] = (mlm, {
        "why": "Megatron-LM TP=2 on one node, TP all-reduces well under a quarter of the step",
        "must_flag": [], "must_not_flag": ["*"]})
    return out


def main() -> int:
    for name, (job, labels) in cases().items():
        job.write(os.path.join(HERE, name), labels)
        print(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
