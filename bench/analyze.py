"""Post-mortem analysis speed and memory: diag vs Holistic Trace Analysis on the same Kineto traces.

    python -m bench.analyze [--ranks 16] [--steps 40] [--mib-per-rank N] [--keep DIR]
    python -m bench.analyze --sweep 1,10,100,1000 [--ranks 2] [--hta-max-mib 1200] [--keep DIR]
    python -m bench.analyze --tiny [--repeat 9]    (2 KB inputs: start-up, bench/analyze_startup.py)
    python -m bench.analyze --diag-trace 16x1000,64x1000 [--baseline /path/to/other/checkout]
        [--diag-source zero3|ddp_contention] [--windowed]

Input: a real 2-rank gloo run (sample_traces/generate_kineto.py, `--steps` profiled steps) in its
GPU-shaped form (HTA only analyzes GPU kernels), replicated to `--ranks` uncompressed rank files,
pretty-printed like torch's own export. `--mib-per-rank` sizes each rank file by cutting the run
after fewer steps or tiling its steps (shifted in time, renumbered, new correlation ids), so one
real run makes rank files of any size; `--sweep` measures total input sizes (MiB) in one run, with
the rank count `--ranks` (more where a file would exceed 150 MiB, the issue's rank-file size).
Each tool runs in its own subprocess: the wall time of the whole process (start and imports
included: `python -m diag analyze --json DIR` for diag), the load + analysis time after imports, and
the peak memory of its whole process tree (both tools parse ranks in worker processes), sampled
every 20 ms with psutil as PSS (shared pages split between processes) and as the plain RSS sum.
diag does everything `diag analyze` does (all rules, report document); HTA computes the figures both
define (temporal breakdown, communication/computation overlap). Printed as ratios (goal: >= 5x
faster, diag's peak RSS <= the uncompressed trace size).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_docs(folder: str, steps: int) -> list[dict[str, Any]]:
    """The two GPU-shaped rank traces of one real run (made once, kept under `folder`/src)."""
    src = os.path.join(folder, "src")
    if not os.path.exists(os.path.join(src, "gpu-rank1.json.gz")):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
        cmd = [
            sys.executable,
            "-m",
            "sample_traces.generate_kineto",
            src,
            "--steps",
            str(steps),
            "--gpu-shape",
        ]
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=900)
    docs = []
    for r in (0, 1):
        with gzip.open(os.path.join(src, f"gpu-rank{r}.json.gz"), "rt") as f:
            docs.append(json.load(f))
    return docs


def _step_starts(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(start, end) of each ProfilerStep, in time order."""
    return sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )


def resized(doc: dict[str, Any], steps: int) -> dict[str, Any]:
    """`doc` with `steps` profiled steps: the first ones of the run, or its steps tiled (each copy
    shifted by the run's span, steps renumbered, correlation and flow ids offset) when more."""
    events = doc["traceEvents"]
    spans = _step_starts(events)
    t0, t1 = spans[0][0], spans[-1][1]
    head = [e for e in events if "ts" not in e or e["ts"] < t0]  # metadata, before the first step
    body = [e for e in events if "ts" in e and t0 <= e["ts"] < t1]
    n = len(spans)
    out = list(head)
    if steps <= n:
        cut = spans[steps][0] if steps < n else t1
        out.extend(e for e in body if e["ts"] < cut)
    else:
        ids = [e.get("args", {}).get("correlation", 0) for e in body] + [e.get("id", 0) for e in body]
        id_step = max((i for i in ids if isinstance(i, int)), default=0) + 1
        for k in range(-(-steps // n)):
            last = min(n, steps - k * n)
            cut = spans[last][0] if last < n else t1
            for e in body:
                if e["ts"] >= cut:
                    continue
                c = dict(e, ts=e["ts"] + k * (t1 - t0))
                name = str(c.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    c["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * n}"
                if isinstance(c.get("args"), dict) and isinstance(c["args"].get("correlation"), int):
                    c["args"] = dict(c["args"], correlation=c["args"]["correlation"] + k * id_step)
                if isinstance(c.get("id"), int):
                    c["id"] += k * id_step
                out.append(c)
    return {**doc, "traceEvents": out}


def make_input(folder: str, ranks: int, steps: int, mib_per_rank: float | None = None) -> int:
    """Write `ranks` uncompressed GPU-shaped Kineto traces into `folder`/traces (each about
    `mib_per_rank` MiB when given); returns their total size in bytes."""
    docs = source_docs(os.path.dirname(folder.rstrip("/")) if mib_per_rank else folder, steps)
    if mib_per_rank:
        per_step = len(json.dumps(docs[0], indent=2)) / len(_step_starts(docs[0]["traceEvents"]))
        want = max(1, round(mib_per_rank * 2**20 / per_step))
        docs = [resized(d, want) for d in docs]
    total = 0
    out = os.path.join(folder, "traces")
    os.makedirs(out, exist_ok=True)
    # each source document is serialized once, around a placeholder rank, then written per rank
    # with its rank put in: 64 x 150 MiB takes minutes of disk writes, not an hour of json.dump
    texts = []
    for doc in docs:
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": _RANK_MARK, "world_size": ranks}
        text = json.dumps(doc, indent=2).encode()  # pretty-printed, as torch's export writes
        head, mark, tail = text.partition(b'"rank": %d' % _RANK_MARK)
        assert mark and b"%d" % _RANK_MARK not in tail, "the placeholder rank must occur once"
        texts.append((head, tail))
    for rank in range(ranks):
        head, tail = texts[rank % 2]
        path = os.path.join(out, f"rank{rank}.json")
        with open(path, "wb") as f:
            f.write(head)
            f.write(b'"rank": %d' % rank)
            f.write(tail)
        total += os.path.getsize(path)
    return total


_RANK_MARK = 987654321  # a rank no real trace holds: where each file's own rank is written


def tiled_diag_rank(src: str, steps: int) -> bytes:
    """A diag rank file with `steps` steps: `src`'s lines, then its step records (those with an
    integer step) tiled, each copy shifted by the run's span and its steps renumbered."""
    with open(src, "rb") as f:
        lines = f.read().splitlines()
    recs = [json.loads(x) for x in lines[1:]]
    stepped = [r for r in recs if isinstance(r.get("step"), int)]
    n = len({r["step"] for r in stepped})
    t0 = min(r["ts"] for r in stepped if isinstance(r.get("ts"), int))
    t1 = max(r["ts"] + (r.get("dur") or 0) for r in stepped if isinstance(r.get("ts"), int))
    out = [*lines]
    for k in range(1, -(-steps // n)):
        for r in stepped:
            if r["step"] + k * n >= steps:
                continue
            c = dict(r, step=r["step"] + k * n)
            if isinstance(c.get("ts"), int):
                c["ts"] += k * (t1 - t0)
            out.append(json.dumps(c, separators=(",", ":")).encode())
    return b"\n".join(out) + b"\n"


def make_diag_input(folder: str, ranks: int, steps: int, source: str = "zero3") -> int:
    """`ranks` diag rank files of `steps` steps each under `folder`/traces, tiled from a real
    2-rank run in sample_traces/`source` (zero3: ZeRO-3, ~15 KB a rank-step; ddp_contention: plain
    DDP, ~1.3 KB, where the per-(rank, step) tables rather than the per-call rows dominate; rank r a
    copy of its rank r % 2, its header's rank set to r); returns their total size in bytes."""
    out = os.path.join(folder, "traces")
    os.makedirs(out, exist_ok=True)
    srcs = [
        tiled_diag_rank(os.path.join(ROOT, "sample_traces", source, f"rank-{r:05d}.jsonl"), steps)
        for r in (0, 1)
    ]
    total = 0
    for rank in range(ranks):
        head, rest = srcs[rank % 2].split(b"\n", 1)
        header = json.loads(head)
        header.update(rank=rank, world_size=ranks)
        path = os.path.join(out, f"rank-{rank:05d}.jsonl")
        with open(path, "wb") as f:
            f.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
            f.write(rest)
        total += os.path.getsize(path)
    return total


def worker_diag(folder: str) -> None:
    from diag.analyzers import run_all

    from diag.importers import load_inputs
    from diag.metrics.stage import Metrics
    from diag.report import model

    t0 = time.perf_counter()
    trace = load_inputs([folder], slim=True)
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


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _bytecode_env() -> dict[str, str]:
    """The environment without PYTHONDONTWRITEBYTECODE: diag's modules then start from bytecode, as
    an installed wheel's (and HTA's, in site-packages) do; with it set, each diag start compiled
    every module it imports from source (about 0.09 s of a 0.45 s run on a 2 KB trace)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


HIGH_WATER: dict[str, int] = {}  # what -> peak RSS (bytes) of the largest process of its last run


def _watch(
    cmd: list[str], what: str, root: str = ROOT, env_extra: dict[str, str] | None = None
) -> tuple[str, float, int, int, float]:
    """(stdout, wall seconds from start to exit, peak RSS-sum, peak PSS-sum, CPU seconds of the
    process and the workers it waited for) of one command, with diag imported from `root`. The CPU
    time is what a loaded machine does not inflate: wall time there includes waiting for a core."""
    env = {**_bytecode_env(), "OMP_NUM_THREADS": "1", "PYTHONPATH": root, **(env_extra or {})}
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    # run from `root`: `python -m` puts the working directory first on sys.path, before PYTHONPATH
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True, cwd=root
    )
    ps, peak_rss, peak_pss = psutil.Process(proc.pid), 0, 0
    out: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""))
    reader.start()  # a big JSON report must not fill the pipe and stall the tool
    while True:  # reaped here: wait4 gives the kernel's own high-water mark, which sampling can miss
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            HIGH_WATER[what] = usage.ru_maxrss << 10  # KiB: the largest process of the tree
            break
        rss, pss = _tree_memory(ps)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    reader.join()
    if proc.returncode not in (0, 1):  # diag analyze exits 1 when a finding says the job failed
        raise SystemExit(f"{what} failed ({proc.returncode})")
    return "".join(out), wall, peak_rss, peak_pss, _children_cpu() - cpu0


def measure(tool: str, folder: str) -> dict[str, float]:
    """Run one worker; its result plus the peak RSS-sum and PSS-sum (bytes) of its process tree."""
    out, wall, peak_rss, peak_pss, cpu = _watch(
        [sys.executable, "-m", "bench.analyze", "--worker", tool, os.path.abspath(folder)], tool
    )
    return {
        **json.loads(out.strip().splitlines()[-1]),
        "wall": wall,
        "peak_rss": peak_rss,
        "peak_pss": peak_pss,
        "cpu": cpu,
    }


def measure_cli(
    folder: str, root: str = ROOT, *options: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """`diag analyze --json` as a user runs it (diag from the checkout `root`, `env` added to its
    environment): wall time with process start, peak memory, and the report itself."""
    out, wall, peak_rss, peak_pss, cpu = _watch(
        [sys.executable, "-m", "diag", "analyze", "--json", *options, os.path.abspath(folder)],
        "diag",
        root,
        env,
    )
    return {
        "wall": wall,
        "peak_rss": peak_rss,
        "peak_pss": peak_pss,
        "high_water": HIGH_WATER["diag"],
        "cpu": cpu,
        "report": out,
    }


def diag_trace(
    folder: str,
    shape: str,
    baseline: str | None,
    keep: bool,
    windowed: bool = False,
    steps: int | None = None,
    source: str = "zero3",
) -> None:
    """`--diag-trace RANKSxSTEPS`: one line per checkout (this one, and `baseline` when given) with
    input MiB, wall and CPU seconds, the peak RSS (the kernel's high-water mark of the largest
    process) and the sampled peak PSS and RSS sums of the process tree (with workers reading the
    rank files, `trace.rankfiles`, the largest process is not the whole), then the ratio; the two
    reports must be the same document (bounded memory may not change a finding or figure). The
    input is deleted afterwards unless `--keep` was given."""
    ranks, steps = (int(x) for x in shape.lower().split("x"))
    sub = os.path.join(folder, f"diag-{source}-{ranks}x{steps}")
    traces = os.path.join(sub, "traces")
    size = _size(traces) if os.path.isdir(traces) else make_diag_input(sub, ranks, steps, source)
    if windowed:  # read whole against a window of steps at a time (in workers, and in-process)
        runs = [
            ("windowed", measure_cli(traces, ROOT, "--windowed")),
            ("whole", measure_cli(traces, ROOT, "--no-windowed")),
            ("win 1 cpu", measure_cli(traces, ROOT, "--windowed", env={"DIAG_WORKERS": "0"})),
        ]
    else:
        runs = [("this", measure_cli(traces))]
    if baseline:
        runs.append(("baseline", measure_cli(traces, os.path.abspath(baseline))))
    for name, r in runs:
        print(
            f"{ranks:5d} ranks x {steps:6d} steps {size / 2**20:8.1f} MiB  {name:8s} "
            f"{r['wall']:7.2f} s {r['cpu']:7.2f} CPU s  peak RSS {r['high_water'] / 2**20:6.0f} MiB "
            f"({r['high_water'] / size:.2f}x the input; sampled over the process tree: PSS "
            f"{r['peak_pss'] / 2**20:.0f}, RSS {r['peak_rss'] / 2**20:.0f})",
            flush=True,
        )
    if windowed:
        _windowed_ratio(runs[0][1], runs[1][1])
        _workers_ratio(runs[0][1], runs[2][1])
    elif baseline:
        new, old = runs[0][1], runs[1][1]
        same = "same report" if new["report"] == old["report"] else "REPORTS DIFFER"
        print(
            f"{'':44s}peak RSS baseline/this {old['high_water'] / new['high_water']:.2f}x, "
            f"CPU {old['cpu'] / new['cpu']:.2f}x, {same}",
            flush=True,
        )
    if not keep:
        shutil.rmtree(sub, ignore_errors=True)


def _windowed_ratio(windowed: dict[str, Any], whole: dict[str, Any]) -> None:
    """The windowed read's peak and CPU against the whole read's, and whether their reports agree
    but for what the windowed one names (`bench.windowed_doc`)."""
    from bench.windowed_doc import without_what_was_not_done

    a, b = json.loads(whole["report"]), json.loads(windowed["report"])
    said = without_what_was_not_done(a, b)
    same = "same report but for" if a == b else "REPORTS DIFFER beyond"
    print(
        f"{'':44s}peak RSS whole/windowed {whole['high_water'] / windowed['high_water']:.2f}x, "
        f"CPU windowed/whole {windowed['cpu'] / whole['cpu']:.2f}x, {same} not run: "
        f"{', '.join(said['not_run']) or 'none'}; partial: {', '.join(said['partial']) or 'none'}",
        flush=True,
    )


def _workers_ratio(workers: dict[str, Any], alone: dict[str, Any]) -> None:
    """The windowed read in workers (`trace.shards`: the default where it has 2 cores or more)
    against the same read in one process (`DIAG_WORKERS=0`): wall time, the tree's peak PSS, and
    whether the reports are the same document."""
    from diag.trace.workers import cores

    same = "same report" if workers["report"] == alone["report"] else "REPORTS DIFFER"
    print(
        f"{'':44s}windowed, wall in-process/workers {alone['wall'] / workers['wall']:.2f}x on "
        f"{cores()} cores, peak PSS workers/in-process {workers['peak_pss'] / alone['peak_pss']:.2f}x, "
        f"CPU workers/in-process {workers['cpu'] / alone['cpu']:.2f}x, {same}",
        flush=True,
    )


def sweep(folder: str, sizes_mib: list[float], ranks: int, steps: int, hta_max_mib: float) -> None:
    """One table over total input sizes: wall time with process start and peak PSS of each tool,
    and their CPU seconds (process start included; the fair figure on a loaded machine)."""
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(
        f"{'input MiB':>9} {'ranks':>5} {'diag s':>7} {'HTA s':>7} {'speed-up':>8} "
        f"{'diag CPU':>8} {'HTA CPU':>8} {'CPU ratio':>9} "
        f"{'diag PSS MiB':>12} {'HTA PSS MiB':>11} {'diag PSS/input':>14}",
        flush=True,
    )
    for mib in sizes_mib:
        n = max(ranks, -(-int(mib) // 150))
        sub = os.path.join(folder, f"sweep-{mib:g}")
        traces = os.path.join(sub, "traces")
        size = _size(traces) if os.path.isdir(traces) else make_input(sub, n, steps, mib / n)
        ours = measure_cli(traces)
        theirs = measure("hta", traces) if size / 2**20 <= hta_max_mib else None
        hta_s = f"{theirs['wall']:7.2f}" if theirs else f"{'-':>7}"
        ratio = f"{theirs['wall'] / ours['wall']:7.1f}x" if theirs else f"{'-':>8}"
        hta_m = f"{theirs['peak_pss'] / 2**20:11.0f}" if theirs else f"{'-':>11}"
        hta_c = f"{theirs['cpu']:8.2f}" if theirs else f"{'-':>8}"
        cpu_ratio = f"{theirs['cpu'] / ours['cpu']:8.1f}x" if theirs else f"{'-':>9}"
        print(
            f"{size / 2**20:9.1f} {n:5d} {ours['wall']:7.2f} {hta_s} {ratio} "
            f"{ours['cpu']:8.2f} {hta_c} {cpu_ratio} "
            f"{ours['peak_pss'] / 2**20:12.0f} {hta_m} {ours['peak_pss'] / size:14.2f}",
            flush=True,
        )
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def _size(traces: str) -> int:
    return sum(os.path.getsize(os.path.join(traces, f)) for f in os.listdir(traces))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--mib-per-rank", type=float, help="size each rank file to about this many MiB")
    ap.add_argument("--sweep", metavar="MIB,...", help="total input sizes to measure, one table")
    ap.add_argument("--hta-max-mib", type=float, default=1200, help="skip HTA above this input size")
    ap.add_argument("--keep", help="reuse/keep the generated input in this folder")
    ap.add_argument("--tiny", action="store_true", help="2 KB inputs: process start against its floor")
    ap.add_argument("--repeat", type=int, default=9, help="--tiny: runs of each command")
    ap.add_argument(
        "--diag-trace",
        metavar="RANKSxSTEPS",
        help="diag's own traces (tiled from sample_traces/zero3): diag analyze's time and peak memory",
    )
    ap.add_argument(
        "--diag-source",
        default="zero3",
        choices=("zero3", "ddp_contention"),
        help="--diag-trace: the 2-rank sample the rank files are tiled from",
    )
    ap.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="--diag-trace: also run diag from this checkout (another commit), side by side",
    )
    ap.add_argument(
        "--windowed",
        action="store_true",
        help="--diag-trace: diag analyze --windowed against --no-windowed, side by side",
    )
    ap.add_argument("--window-steps", type=int, help="--windowed: diag analyze --window-steps N")
    ap.add_argument("--worker", nargs=2, metavar=("TOOL", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        {"diag": worker_diag, "hta": worker_hta}[args.worker[0]](args.worker[1])
        return 0
    folder = args.keep or tempfile.mkdtemp(prefix="diag-bench-")
    if args.tiny:
        from bench.analyze_startup import startup

        startup(folder, args.repeat)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        return 0
    if args.diag_trace:
        for shape in args.diag_trace.split(","):
            diag_trace(
                folder,
                shape,
                args.baseline,
                keep=bool(args.keep),
                windowed=args.windowed,
                steps=args.window_steps,
                source=args.diag_source,
            )
        return 0
    if (args.sweep and args.hta_max_mib > 0) or not (args.tiny or args.diag_trace or args.sweep):
        import importlib.util

        if importlib.util.find_spec("hta") is None:
            print("bench.analyze: needs Holistic Trace Analysis: pip install -e '.[bench]'", file=sys.stderr)
            return 2
    if args.sweep:
        sweep(folder, [float(x) for x in args.sweep.split(",")], args.ranks, args.steps, args.hta_max_mib)
        return 0
    traces = os.path.join(folder, "traces")
    size = (
        _size(traces)
        if os.path.isdir(traces)
        else make_input(folder, args.ranks, args.steps, args.mib_per_rank)
    )
    print(f"input: {len(os.listdir(traces))} rank traces, {size / 2**20:.1f} MiB uncompressed")
    ours, theirs = measure("diag", traces), measure("hta", traces)
    for name, r in (("diag", ours), ("HTA", theirs)):
        print(
            f"{name:5s} load+analysis {r['secs']:7.2f} s (whole process {r['wall']:7.2f} s)"
            f"   peak PSS {r['peak_pss'] / 2**20:7.1f} MiB"
            f"   (RSS summed over processes {r['peak_rss'] / 2**20:7.1f} MiB)"
        )
    print(
        f"speed-up diag vs HTA: {theirs['secs'] / ours['secs']:.1f}x after imports, "
        f"{theirs['wall'] / ours['wall']:.1f}x with process start (goal >= 5x)"
    )
    print(
        f"peak PSS HTA/diag: {theirs['peak_pss'] / ours['peak_pss']:.1f}x; diag peak PSS / input size: "
        f"{ours['peak_pss'] / size:.2f}, RSS-sum / input size {ours['peak_rss'] / size:.2f} (goal <= 1.0)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
