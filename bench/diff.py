"""`diag diff` vs Holistic Trace Analysis' TraceDiff on the same pair of Kineto trace sets.

    python -m bench.diff [--ranks 8] [--steps 10] [--keep DIR]

Input: bench.analyze's GPU-shaped traces of a real 2-rank gloo run, replicated to `--ranks` rank
files (baseline), and the same files with the two source ranks swapped (candidate: rank 1 computes
on a batch twice as large, so every rank's ops change). Each tool runs in its own subprocess: wall
time after imports and the peak PSS of its process tree. HTA: `TraceDiff.compare_traces` over all
ranks and iterations; diag: the op/kernel table alone (`diag.diff.kineto.ops_diff`) and the whole
`diag diff` document. Agreement: per op/kernel name, counts equal (HTA also lists cuda_runtime
events, which diag does not import; those names are left out and counted).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

from bench.analyze import _tree_memory, make_input

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_pair(folder: str, ranks: int, steps: int) -> tuple[str, str]:
    base, cand = os.path.join(folder, "traces"), os.path.join(folder, "candidate")
    if not os.path.isdir(base):
        make_input(folder, ranks, steps)
    if not os.path.isdir(cand):
        os.makedirs(cand)
        n = len(os.listdir(base))
        for r in range(n):  # rank r gets the trace written for rank r^1, relabelled as rank r
            with open(os.path.join(base, f"rank{r ^ 1 if r ^ 1 < n else r}.json")) as f:
                doc = json.load(f)
            doc["distributedInfo"]["rank"] = r
            with open(os.path.join(cand, f"rank{r}.json"), "w") as f:
                json.dump(doc, f)
    return base, cand


def worker(tool: str, base: str, cand: str, out: str) -> None:
    t0 = time.perf_counter()
    if tool == "hta":
        import logging
        import warnings

        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        from hta.trace_diff import LabeledTrace, TraceDiff

        a, b = LabeledTrace(trace_dir=base, label="a"), LabeledTrace(trace_dir=cand, label="b")
        df = TraceDiff.compare_traces(a, b, a.ranks(), b.ranks(), a.iterations(), b.iterations())
        counts = {str(n): [int(x), int(y)] for n, x, y in zip(df.index, df["a_counts"], df["b_counts"])}
    else:
        from diag.diff import kineto, model
        from diag.diff.sides import load_side

        a, b = load_side("baseline", [base]), load_side("candidate", [cand])
        if tool == "diag":
            model.build(a, b)
        df = kineto.ops_diff(a, b).groupby("name")[["count_a", "count_b"]].sum()
        counts = {str(n): [int(r.count_a), int(r.count_b)] for n, r in df.iterrows()}
    secs = time.perf_counter() - t0
    with open(out, "w") as f:
        json.dump({"secs": secs, "counts": counts}, f)


def measure(tool: str, base: str, cand: str, out: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, "HTA_DISABLE_NS_ROUNDING": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.diff", "--worker", tool, base, cand, out],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        peak = max(peak, _tree_memory(ps)[1])
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} worker failed ({proc.returncode})")
    with open(out) as f:
        return {**json.load(f), "peak_pss": peak}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--keep", help="reuse/keep the generated input in this folder")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    folder = args.keep or tempfile.mkdtemp(prefix="diag-bench-diff-")
    base, cand = make_pair(folder, args.ranks, args.steps)
    size = sum(os.path.getsize(os.path.join(d, f)) for d in (base, cand) for f in os.listdir(d))
    print(f"input: 2 x {len(os.listdir(base))} rank traces, {size / 2**20:.1f} MiB uncompressed")
    res = {t: measure(t, base, cand, os.path.join(folder, f"{t}.json")) for t in ("hta", "diag-ops", "diag")}
    for name, r in res.items():
        print(f"{name:9s} {r['secs']:7.2f} s   peak PSS {r['peak_pss'] / 2**20:7.1f} MiB")
    theirs, ours = res["hta"]["counts"], res["diag-ops"]["counts"]
    only_hta = sorted(set(theirs) - set(ours))
    same = sum(theirs[n] == ours[n] for n in ours if n in theirs)
    print(
        f"counts agree on {same} of {len(ours)} names diag lists; {len(set(ours) - set(theirs))} names "
        f"only diag lists; {len(only_hta)} only HTA lists ({', '.join(only_hta[:3])})"
    )
    print(
        f"time HTA / diag ops table: {res['hta']['secs'] / res['diag-ops']['secs']:.1f}x; "
        f"HTA / whole diag diff: {res['hta']['secs'] / res['diag']['secs']:.1f}x"
    )
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
