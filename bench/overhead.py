"""Step-time overhead of diag's agent vs torch.profiler and DeepSpeed's own profilers, measured side
by side in one real 2-rank DeepSpeed job (the test GPT, hidden 128, 4 blocks, ZeRO-2 bf16, CPU/gloo):

    python -m bench.overhead [--rounds 12] [--block 10] [-- --hidden 256 --seq 128 ...]

(flags after `--` go to the job: tests/workloads/gpt_ds.py's size knobs)

The job trains in blocks of `--block` steps; before each block one variant is switched on in-process
(agent started, profiler entered) and after it switched off, in a shuffled order each round
(bench/variants.py). Two tables: wall time per step (the slowest rank) and CPU time per step (the
ranks' process CPU summed: the work a variant adds, which other jobs on a shared machine do not
inflate); per variant the median and the 20th percentile of its steps (each block's first step left
out: it pays the switch).

Always-on (`layers_every=50`) is derived from two measured variants, because a block of a few steps
rarely contains the one sampled step in 50: (49 x "diag, not sampled" + 1 x "diag per-layer") / 50.
"diag per-layer" counts FLOPs as the agent does by default (first sample of an input signature, then
1 in 4: here 3 of a block's 9 measured steps, more than in a long run); "FLOPs every step" is
`flops_every=1`.

The agent's own time comes last: its hooks' CPU time (the `self_time` option) plus its writer
thread's, per rank and step (`SELF-TIMED COST PER RANK-STEP`, goal <= 0.1 ms, counted from a block's
third step: see SELF_SKIP), then by part: the fixed
cost of each step (boundaries, overflow and loss checks, memory, step listeners), the comms
collector's (one record per collective the job issues) and the writer's; DeepSpeed numbers the
measured steps from 1000, past the job's first steps that the agent tracks throughout.

The added time that the 10x goal compares is measured twice: from the pooled quantiles, and paired
by round (each variant's block median minus the bare block's of the same round, then the median over
rounds), which cancels the machine's slow drift between rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = ["--zero", "2", "--dtype", "bf16", "--hidden", "128", "--layers", "4", "--seq", "64"]
EVERY = 50  # the agent's default layers_every
PROFILER = "torch.profiler (CPU, record_shapes)"
# the self-timed variant's own time counts from the third step of a block: the first pays the switch,
# the second is the one step an attach tracks modules on to learn its collectives' (a long run pays
# it once; the bench restarts the agent every block: counted, it put ~30 us/step of "fixed" cost in a
# 10-step block)
SELF_SKIP = 2
ALWAYS_ON = f"diag always-on (layers_every={EVERY}, derived)"


Times = list[dict[str, list[list[list[float]]]]]  # rank -> variant -> block -> step -> (wall, cpu)


def pooled_steps(per_rank: Times, cpu: bool) -> dict[str, list[float]]:
    """{variant: one figure per step}, pooled over the variant's blocks, each block's first step left
    out (it pays the switch). Wall: the slowest rank (collectives keep ranks in step); CPU: the sum
    over ranks (the job's work)."""
    out: dict[str, list[float]] = {}
    for name in per_rank[0]:
        out[name] = []
        for blocks in zip(*(r[name] for r in per_rank)):
            for ranks in list(zip(*blocks))[1:]:
                out[name].append(sum(t[1] for t in ranks) if cpu else max(t[0] for t in ranks))
    return out


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(steps: dict[str, list[float]], q: float) -> dict[str, float]:
    """The q-quantile step time per variant, plus the derived always-on figure."""
    out = {k: quantile(v, q) for k, v in steps.items()}
    out[ALWAYS_ON] = ((EVERY - 1) * out["diag, not sampled"] + out["diag per-layer (layers_every=1)"]) / EVERY
    return out


def paired_added(per_rank: Times, cpu: bool) -> dict[str, float]:
    """{variant: added seconds per step}, the median over rounds of (its block's median step minus
    the bare block's median step in the same round); plus the derived always-on figure."""

    def block_medians(name: str) -> list[float]:
        out = []
        for blocks in zip(*(r[name] for r in per_rank)):
            steps = [
                sum(t[1] for t in ranks) if cpu else max(t[0] for t in ranks)
                for ranks in list(zip(*blocks))[1:]
            ]
            out.append(quantile(steps, 0.5))
        return out

    bare = block_medians("bare")
    out = {}
    for name in per_rank[0]:
        if name != "bare":
            out[name] = quantile([v - b for v, b in zip(block_medians(name), bare)], 0.5)
    out[ALWAYS_ON] = ((EVERY - 1) * out["diag, not sampled"] + out["diag per-layer (layers_every=1)"]) / EVERY
    return out


def paired_lines(per_rank: Times, cpu: bool, bare_s: float) -> list[str]:
    added = paired_added(per_rank, cpu)
    rows = [
        "added per step, paired by round:"
        + "".join(f"\n  {name:43} {v * 1e3:+8.2f} ms  ({v / bare_s:+.1%})" for name, v in added.items())
    ]
    for name in (ALWAYS_ON, "diag per-layer (layers_every=1)"):
        a, prof = added[name], added[PROFILER]
        ratio = f"{prof / a:.1f}x" if a > 0 and prof > 0 else "n/a (an added time <= 0: within noise)"
        rows.append(f"torch.profiler's added time / {name}'s, paired: {ratio}")
    return rows


def own_lines(ranks: list[dict[str, Any]], times: Times, block: int) -> str:
    """The agent's own time, self-measured (hooks + writer thread), per counted step: a figure free
    of the machine's noise, and a lower bound (the wrappers' glue, backward node hooks and cache
    effects are outside it). Per rank-step: the mean over all self-timed blocks (tracked steps
    included: one in `attribute_every`) over the ranks, and the median block's. Always-on adds the
    sampled steps' measured cost."""
    per_block = [sum(b) for b in zip(*(r["own_ns"] for r in ranks))]
    if not per_block:
        return "no self-timed blocks"
    n_ranks, counted = len(ranks), block - SELF_SKIP
    mean_s = sum(per_block) / len(per_block) / 1e9 / counted
    own_s = quantile(per_block, 0.5) / 1e9 / counted
    added = paired_added(times, cpu=True)
    sampled = added["diag per-layer (layers_every=1)"] - added["diag, not sampled"]
    always = mean_s * (EVERY - 1) / EVERY + (mean_s + max(sampled, 0.0)) / EVERY
    prof = added[PROFILER]
    ratio = f"{prof / always:.1f}x" if always > 0 and prof > 0 else "n/a"
    return (
        f"SELF-TIMED COST PER RANK-STEP (not sampled; hooks + writer CPU): "
        f"{mean_s / n_ranks * 1e3:.3f} ms mean over {len(per_block)} blocks, "
        f"{own_s / n_ranks * 1e3:.3f} ms median block (goal: <= 0.1 ms)\n"
        f"diag's own time, sum of {n_ranks} ranks: {mean_s * 1e3:.3f} ms per step not sampled (mean); "
        f"always-on with the sampled steps' paired CPU cost "
        f"({max(sampled, 0.0) * 1e3:.2f} ms each, 1 in {EVERY}): {always * 1e3:.3f} ms per step\n"
        f"torch.profiler's added CPU time (paired, {prof * 1e3:.2f} ms) / diag always-on's own "
        f"time: {ratio}\n"
        f"{split_line(ranks, counted)}"
    )


FIXED = (
    "boundary",
    "steps",
    "overflow",
    "memory",
    "modules",
    "layers",
)  # once per step, whatever the job issues


def split_line(ranks: list[dict[str, Any]], counted: int) -> str:
    """The self-timed cost per rank-step by part, summed over the self-timed blocks: the fixed part
    (step boundaries, overflow and loss checks, memory, step listeners), what grows with the
    collectives the job issues (comms: one record each), and the writer thread."""
    parts: dict[str, int] = {}
    blocks = 0
    for r in ranks:
        for block in r.get("own_by") or []:
            blocks += 1
            for k, v in block.items():
                parts[k] = parts.get(k, 0) + v
    if not blocks:
        return "by part: n/a"
    per = {k: v / blocks / counted / 1e3 for k, v in parts.items()}  # us per rank-step
    fixed = sum(per.get(k, 0.0) for k in FIXED)
    parts = " + ".join(f"{k} {per[k]:.1f}" for k in FIXED if per.get(k))  # memory, layers: inside steps
    rest = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items()) if k not in FIXED)
    return f"by part, us per rank-step: fixed per step {fixed:.1f} ({parts}); {rest}"


def added_ratio(med: dict[str, float], name: str) -> str:
    added, added_prof = med[name] - med["bare"], med[PROFILER] - med["bare"]
    if added > 0 and added_prof > 0:
        return f"{added_prof / added:.1f}x"
    return "n/a (an added time <= 0: within noise)"


def table(steps: dict[str, list[float]], title: str) -> str:
    """Median and 20th percentile: on a loaded machine the low quantile is the stabler estimate
    (preemption only ever adds time to a step)."""
    med, low = summarize(steps, 0.5), summarize(steps, 0.2)
    rows = [f"{title:45} {'median ms':>9} {'x bare':>7} {'p20 ms':>8} {'x bare':>7} {'steps':>6}"]
    for name in med:
        n = len(steps.get(name, [])) or "-"
        rows.append(
            f"{name:45} {med[name] * 1e3:9.2f} {med[name] / med['bare']:7.3f} "
            f"{low[name] * 1e3:8.2f} {low[name] / low['bare']:7.3f} {n:>6}"
        )
    for name in (ALWAYS_ON, "diag per-layer (layers_every=1)"):
        rows.append(
            f"torch.profiler's added time / {name}'s: median {added_ratio(med, name)}, "
            f"p20 {added_ratio(low, name)}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--block", type=int, default=10, help="steps per block (first one not counted; >= 3)")
    p.add_argument("--seed", type=int, default=0)
    argv = sys.argv[1:] if argv is None else argv
    job = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.block <= SELF_SKIP:
        p.error(
            f"--block must be at least {SELF_SKIP + 1}: the self-timed figure starts at step {SELF_SKIP + 1}"
        )
    sys.path.insert(0, ROOT)
    from tests.workloads import launch

    with tempfile.TemporaryDirectory(prefix="diag-bench-") as tmp:
        result = os.path.join(tmp, "times.json")
        launch.run(
            "bench.variants",
            [
                "--rounds",
                str(args.rounds),
                "--block",
                str(args.block),
                "--seed",
                str(args.seed),
                "--result",
                result,
                *JOB,
                *job,
            ],
            timeout=3600,
        )
        with open(result) as f:
            ranks = json.load(f)
        times = [r["times"] for r in ranks]
        for cpu, title in (
            (False, "wall time per step (slowest rank)"),
            (True, "CPU time per step (sum of ranks)"),
        ):
            steps = pooled_steps(times, cpu=cpu)
            print(table(steps, title))
            print("\n".join(paired_lines(times, cpu, quantile(steps["bare"], 0.5))))
            print()
        print(own_lines(ranks, times, args.block))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
