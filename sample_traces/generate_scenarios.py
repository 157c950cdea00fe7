"""Regenerate the analyzer scenario traces from real 2-rank DeepSpeed runs of the test GPT (CPU, gloo).

    python -m sample_traces.generate_scenarios [NAME ...] [--out sample_traces]

One folder per scenario: the rank-*.jsonl the agent wrote, and a README.md saying what it shows and
which rules must flag it. `zero3_slow_link` runs each rank in its own network namespace ("node-a",
"node-b") joined by a rate-limited veth pair; it needs root and is skipped (with the reason) elsewhere.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

import diag
from diag.analyzers import run_all
from sample_traces import netns
from tests.workloads import launch

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "tests.workloads.gpt_ds"


@dataclass
class Scenario:
    shows: str
    flags: tuple[str, ...]  # rules that must fire
    args: tuple[str, ...]
    slow_link: bool = False
    ds: dict[str, Any] = field(default_factory=dict)  # ds_config overrides (via scenario_job)

    @property
    def module(self) -> str:
        return "sample_traces.scenario_job" if self.ds else MODULE

    def env(self) -> dict[str, str]:
        return {"DIAG_SCENARIO_DS": json.dumps(self.ds)} if self.ds else {}


SCENARIOS: dict[str, Scenario] = {
    "embedding_heavy": Scenario(
        "ZeRO-3 with a 65536-token vocabulary and hidden size 32: the embedding (wte) and output layer "
        "(head) hold almost all parameters, so their all-gathers / reduce-scatters dominate each step. "
        "Prefetch off and 1 MB reduce buckets (a low-memory ZeRO-3 setting), so each module gathers its "
        "own parameters when it runs and the comms collector can name it.",
        ("embedding_comm",),
        ("--zero", "3", "--steps", "8", "--vocab", "65536", "--hidden", "32", "--seq", "16", "--batch", "2"),
        ds={"zero_optimization": {"stage3_prefetch_bucket_size": 0, "reduce_bucket_size": 1_000_000}}),
    "embedding_moved": Scenario(
        "embedding_heavy after moving the embedding out of ZeRO-3's partitioning: the same model and "
        "batch under ZeRO-2. Its transformer blocks are below ZeRO-3's persistence threshold (1e5 "
        "parameters), so under ZeRO-3 only the embedding (wte) and output layer (head) were partitioned "
        "and gathered in every forward; under ZeRO-2 every rank keeps them whole and only their "
        "gradients and optimizer state are partitioned. (embedding_heavy, embedding_moved) is the "
        "before/after pair `diag diff` must explain.",
        (),
        ("--zero", "2", "--steps", "8", "--vocab", "65536", "--hidden", "32", "--seq", "16", "--batch", "2"),
        ds={"zero_optimization": {"reduce_bucket_size": 1_000_000}}),
    "zero3_slow_link": Scenario(
        "ZeRO-3 with one rank per network namespace (hosts node-a and node-b) over a veth pair limited "
        "to 40 Mbit/s by tc tbf: parameter gathers crawl across the 'nodes'.",
        ("zero3_slow_link",), ("--zero", "3", "--steps", "5"), slow_link=True),
    "overflow_storm": Scenario(
        "fp16 with dynamic loss scaling (initial scale 2^8, hysteresis 1) and an inf gradient on rank 0 at "
        "steps 3-10: every rank skips those steps and the scale halves from 256 down to "
        "min_loss_scale 1 (one more overflow and DeepSpeed aborts the run).",
        ("overflow_storm",),
        ("--zero", "2", "--dtype", "fp16", "--steps", "14", "--overflow-at", "3,4,5,6,7,8,9,10")),
    "straggler": Scenario(
        "ZeRO-1; rank 1 sleeps 80 ms before every step's batch, so rank 0 waits for it in collectives.",
        ("straggler",), ("--zero", "1", "--steps", "10", "--slow-rank", "1", "--slow-ms", "80")),
    "input_stall": Scenario(
        "ZeRO-1; the loop sleeps 60 ms after every optimizer step before fetching the next batch (a slow "
        "input pipeline); per-layer timing on every step shows the lead-in before each first forward.",
        ("idle_between_steps",),
        ("--zero", "1", "--steps", "8", "--step-sleep", "0.06", "--layers-every", "1")),
}


def run_local(sc: Scenario, args: list[str]) -> None:
    launch.run(sc.module, args, timeout=300, env=sc.env())


def run_slow_link(sc: Scenario, args: list[str], rate: str | None = "40mbit") -> None:
    """Both ranks, one per namespace, rendezvous over the slow veth (gloo bound to it)."""
    with netns.slow_link(rate) as (a, b):
        procs = []
        for rank, node in enumerate((a, b)):
            env = launch.job_env({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                  "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": a.addr, "MASTER_PORT": "29533",
                                  "GLOO_SOCKET_IFNAME": node.ifname, **sc.env()})
            procs.append(subprocess.Popen(node.wrap([sys.executable, "-m", sc.module, *args]), env=env,
                                          cwd=launch.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate(timeout=300)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("slow-link run failed:\n" + "\n---\n".join(o[-3000:] for o in outs))


def readme(name: str, sc: Scenario, fired: list[str]) -> str:
    must = ", ".join(f"`{r}`" for r in sc.flags) or "nothing (every rule stays silent)"
    also = ", ".join(f"`{r}`" for r in fired if r not in sc.flags) or "nothing else"
    how = f"`{sc.module} {' '.join(sc.args)} --diag`"
    if sc.ds:
        how += f" with ds_config overrides `{json.dumps(sc.ds)}`"
    if sc.slow_link:
        how += ", one rank per network namespace on a rate-limited link"
    return (f"# {name}\n\n{sc.shows}\n\nMust flag: {must}.\nAlso flagged when generated: {also}.\n\n"
            f"Generated (never hand-edited) by `python -m sample_traces.generate_scenarios {name}` from\n"
            f"{how}.\n")


def generate(name: str, out_root: str = HERE) -> str:
    """Run one scenario into a fresh folder `out_root/name` (replacing the old one on success)."""
    sc = SCENARIOS[name]
    tmp = tempfile.mkdtemp(prefix=f"diag-{name}-")
    args = [*sc.args, "--diag", "--trace-dir", tmp]
    (run_slow_link if sc.slow_link else run_local)(sc, args)
    dest = os.path.join(out_root, name)
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for f in sorted(glob.glob(os.path.join(tmp, "rank-*.jsonl"))):
        shutil.copyfile(f, os.path.join(dest, os.path.basename(f)))
    shutil.rmtree(tmp, ignore_errors=True)
    findings, failures = run_all(diag.load(dest))
    missing = set(sc.flags) - {x.rule for x in findings}
    if missing or failures:
        raise RuntimeError(f"{name}: rules {sorted(missing)} did not fire ({failures or 'no errors'})")
    with open(os.path.join(dest, "README.md"), "w") as f:
        f.write(readme(name, sc, sorted({x.rule for x in findings})))
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help=f"of {', '.join(SCENARIOS)} (default: all; the healthy "
                   "baseline is sample_traces.generate's)")
    p.add_argument("--out", default=HERE)
    a = p.parse_args(argv)
    unknown = [n for n in a.names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}")
    for name in a.names or list(SCENARIOS):
        why = netns.unavailable() if SCENARIOS[name].slow_link else None
        if why:
            print(f"{name}: skipped ({why})")
            continue
        print(f"{name}: {generate(name, a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
