"""Post-mortem analysis speed and memory: diag vs Holistic Trace Analysis on the same Kineto traces.

    python -m bench.analyze [--ranks 16] [--steps 40] [--keep DIR]

Input: a real 2-rank gloo run (sample_traces/generate_kineto.py, `--steps` profiled steps) in its
GPU-shaped form (HTA only analyzes GPU kernels), replicated to `--ranks` uncompressed rank files,
pretty-printed like torch's own export.
Each tool runs in its own subprocess: load + analysis wall time (after imports) and the peak RSS of
its whole process tree (both tools parse ranks in worker processes), sampled every 20 ms with psutil
as PSS (shared pages split between processes) and as the plain RSS sum.
diag does everything `diag analyze` does (all rules, report document); HTA computes the figures both
define (temporal breakdown, communication/computation overlap). Printed as ratios (goal: >= 5x
faster, diag's peak RSS <= the uncompressed trace size).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_input(folder: str, ranks: int, steps: int) -> int:
    """Write `ranks` uncompressed GPU-shaped Kineto traces; returns their total size in bytes."""
    src = os.path.join(folder, "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    subprocess.run(
        [sys.executable, "-m", "sample_traces.generate_kineto", src, "--steps", str(steps), "--gpu-shape"],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    docs = []
    for r in (0, 1):
        with gzip.open(os.path.join(src, f"gpu-rank{r}.json.gz"), "rt") as f:
            docs.append(json.load(f))
    total = 0
    out = os.path.join(folder, "traces")
    os.makedirs(out, exist_ok=True)
    for rank in range(ranks):
        doc = docs[rank % 2]
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": rank, "world_size": ranks}
        path = os.path.join(out, f"rank{rank}.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)  # pretty-printed, as torch's export_chrome_trace writes
        total += os.path.getsize(path)
    return total


def worker_diag(folder: str) -> None:
    from diag.analyzers import run_all

    from diag.importers import load_inputs
    from diag.metrics.stage import Metrics
    from diag.report import model

    t0 = time.perf_counter()
    trace = load_inputs([folder])
    metrics = Metrics(trace)
    findings, failures = run_all(trace, metrics=metrics)
    model.build(trace, findings, failures, metrics)
    print(json.dumps({"secs": time.perf_counter() - t0, "ranks": len(trace.ranks)}))


def worker_hta(folder: str) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    a = TraceAnalysis(trace_dir=folder)
    a.get_temporal_breakdown(visualize=False)
    a.get_comm_comp_overlap(visualize=False)
    print(json.dumps({"secs": time.perf_counter() - t0, "ranks": len(a.t.get_ranks())}))


def _tree_memory(ps: psutil.Process) -> tuple[int, int]:
    """(RSS sum, PSS sum) of a process and its children. PSS splits pages shared between forked
    workers, so it is the tree's real footprint; the RSS sum counts shared pages once per process."""
    rss = pss = 0
    for p in [ps, *ps.children(recursive=True)]:
        try:
            m = p.memory_full_info()
            rss, pss = rss + m.rss, pss + getattr(m, "pss", m.rss)
        except psutil.Error:
            pass
    return rss, pss


def measure(tool: str, folder: str) -> dict[str, float]:
    """Run one worker; its result plus the peak RSS-sum and PSS-sum (bytes) of its process tree."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.analyze", "--worker", tool, folder],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    ps, peak_rss, peak_pss = psutil.Process(proc.pid), 0, 0
    while proc.poll() is None:
        rss, pss = _tree_memory(ps)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.02)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"{tool} worker failed ({proc.returncode})")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss": peak_rss, "peak_pss": peak_pss}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--keep", help="reuse/keep the generated input in this folder")
    ap.add_argument("--worker", nargs=2, metavar=("TOOL", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        {"diag": worker_diag, "hta": worker_hta}[args.worker[0]](args.worker[1])
        return 0
    folder = args.keep or tempfile.mkdtemp(prefix="diag-bench-")
    traces = os.path.join(folder, "traces")
    size = (
        sum(os.path.getsize(os.path.join(traces, f)) for f in os.listdir(traces))
        if os.path.isdir(traces)
        else make_input(folder, args.ranks, args.steps)
    )
    print(f"input: {len(os.listdir(traces))} rank traces, {size / 2**20:.1f} MiB uncompressed")
    ours, theirs = measure("diag", traces), measure("hta", traces)
    for name, r in (("diag", ours), ("HTA", theirs)):
        print(
            f"{name:5s} load+analysis {r['secs']:7.2f} s   peak PSS {r['peak_pss'] / 2**20:7.1f} MiB"
            f"   (RSS summed over processes {r['peak_rss'] / 2**20:7.1f} MiB)"
        )
    print(f"speed-up diag vs HTA: {theirs['secs'] / ours['secs']:.1f}x (goal >= 5x)")
    print(
        f"peak PSS HTA/diag: {theirs['peak_pss'] / ours['peak_pss']:.1f}x; diag peak PSS / input size: "
        f"{ours['peak_pss'] / size:.2f}, RSS-sum / input size {ours['peak_rss'] / size:.2f} (goal <= 1.0)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
