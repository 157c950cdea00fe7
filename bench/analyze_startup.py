"""`diag analyze` on 2 KB inputs: process start, imports and analysis against the floor under them.

    python -m bench.analyze --tiny [--repeat 9]

Commands, run interleaved `--repeat` times each so that load hits them alike: `python -c pass`
(the interpreter), `python -c "import pandas"` (the floor: a `Trace` holds pandas frames), then
`python -m diag analyze` on a 2 KB diag trace (the first whole lines of sample_traces/healthy's
rank 0) and on a 2 KB Kineto trace (the metadata, first ProfilerStep and its first ops of
sample_traces/kineto_gloo_dp's rank 0), as a terminal report and with --json. Printed: the minimum
and median wall time and CPU seconds (user + system) of each whole process. diag's modules run from
bytecode as an installed wheel's do (`bench.analyze._bytecode_env`).
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.analyze import ROOT, _bytecode_env

SIZE = 2048


def tiny_diag(folder: str) -> str:
    """A diag trace directory with one rank file of at most SIZE bytes: the header, the first step
    records (two measured steps at least), then the first other records that fit."""
    out = os.path.join(folder, "tiny-diag")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(ROOT, "sample_traces", "healthy", "rank-00000.jsonl"), "rb") as f:
        header, *records = f.readlines()
    steps = [r for r in records if json.loads(r)["k"] == "step"]
    kept = header
    for line in steps + [r for r in records if r not in steps]:
        if len(kept) + len(line) <= SIZE:
            kept += line
    with open(os.path.join(out, "rank-00000.jsonl"), "wb") as f:
        f.write(kept)
    return out


def tiny_kineto(folder: str) -> str:
    """A Kineto trace of at most SIZE bytes: metadata, the first profiled step and its first ops."""
    with gzip.open(os.path.join(ROOT, "sample_traces", "kineto_gloo_dp", "rank0.json.gz"), "rt") as f:
        doc = json.load(f)
    events = doc.pop("traceEvents")
    step = min(
        (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    ops = (e for e in events if e.get("ph") == "X" and e is not step)
    inside = sorted((e for e in ops if 0 <= e["ts"] - step["ts"] < step["dur"]), key=lambda e: e["ts"])
    out: dict[str, Any] = {**doc, "traceEvents": [e for e in events if e.get("ph") == "M"] + [step]}
    for e in inside:
        out["traceEvents"].append(e)
        if len(json.dumps(out, separators=(",", ":"))) > SIZE:
            out["traceEvents"].pop()
            break
    path = os.path.join(folder, "tiny-kineto.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    return path


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def startup(folder: str, repeat: int) -> None:
    env = {**_bytecode_env(), "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    diag_dir, kineto = tiny_diag(folder), tiny_kineto(folder)
    py = sys.executable
    cmds = {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import pandas' (floor)": [py, "-c", "import pandas"],
        "diag analyze, 2 KB diag trace": [py, "-m", "diag", "analyze", diag_dir],
        "diag analyze --json, 2 KB diag trace": [py, "-m", "diag", "analyze", "--json", diag_dir],
        "diag analyze, 2 KB Kineto trace": [py, "-m", "diag", "analyze", kineto],
        "diag analyze --json, 2 KB Kineto trace": [py, "-m", "diag", "analyze", "--json", kineto],
    }
    for cmd in cmds.values():  # once untimed: bytecode written, files cached
        subprocess.run(cmd, env=env, capture_output=True)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for _ in range(repeat):
        for name, cmd in cmds.items():
            times[name].append(_run(cmd, env))
    print(f"{'command':40s} {'wall min':>8} {'wall med':>8} {'CPU min':>8} {'CPU med':>8}  (seconds)")
    for name, ts in times.items():
        walls, cpus = [w for w, _ in ts], [c for _, c in ts]
        print(
            f"{name:40s} {min(walls):8.3f} {statistics.median(walls):8.3f} "
            f"{min(cpus):8.3f} {statistics.median(cpus):8.3f}"
        )
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; goal: diag < 0.3 s wall")
