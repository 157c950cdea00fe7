"""Training-log import speed and memory: diag's log importer next to two references on the same files.

    python -m bench.logs [--mb 200] [--nodes 8] [--keep DIR] [--public DIR]

Input: a multi-node log set (one file per node, `--mb` MiB in all) made of the fixture logs' real
formats (tests/fixtures/logs: Megatron-LM iteration and memory lines, DeepSpeed `step=` / timer /
OVERFLOW lines, HF Trainer dicts and progress bars, start-up dumps), each line behind the launcher's
`worker-N: [rankR]:` prefixes, with the iteration numbers counting on so every file is one long run.
Each reader runs in its own subprocess, timed after its imports, with its peak RSS (its own `ru_maxrss`):
- `wc -l`: the disk-speed floor (reads every byte, parses nothing);
- a plain regex pass: one compiled Megatron iteration regex over every line, keeping (iteration,
  ms, loss): what a user's one-off script does;
- diag: `import_log` on every file (all families, overflows, layout, failures), then the join of
  the files (`merge_parts`).
Printed as MiB per CPU second (the machines are shared: wall time is printed too) and ratios to
`wc -l` (whose CPU time is taken as its wall time). With `--public DIR`, also a table of what diag
read from each log in DIR (real public logs) next to what a grep of the same file counts (iteration /
step lines and the HF training bar's counts, skipped iterations, the last iteration, world size).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "logs")
SOURCES = (
    "megatron_loss_spike.log",
    "megatron_lm_fp16.log",
    "ds_zero2_fp16.log",
    "ds_throughput_drop.log",
    "megatron_deepspeed_tp2_pp2.log",
    "hf_noisy_finetune.log",
    "ds_fp16_every_rank_overflow.log",
)
_ITER_NUM = re.compile(r"(\biteration\s+|step=|global_step=)(\d+)")
ITER = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)"
    r".*?lm loss: ([\dE.+-]+)"
)


def _shifter(base: int) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(1) + str(int(m.group(2)) + base)


def make_input(folder: str, mb: int, nodes: int) -> int:
    """Write `nodes` files of about mb/nodes MiB each; returns the total bytes."""
    lines = [
        ln for name in SOURCES for ln in open(os.path.join(FIX, name), encoding="utf-8").read().splitlines()
    ]
    per = mb * 2**20 // nodes
    total = 0
    for node in range(nodes):
        path = os.path.join(folder, f"node{node:02d}.log")
        done, rnd = 0, 0
        with open(path, "w", encoding="utf-8") as f:
            while done < per:
                rank = node * 8 + rnd % 8
                shift = _shifter(rnd * 1000)
                chunk = "".join(
                    f"worker-{node}: [rank{rank}]: " + _ITER_NUM.sub(shift, ln) + "\n" for ln in lines
                )
                f.write(chunk)
                done += len(chunk.encode())
                rnd += 1
        total += os.path.getsize(path)
    return total


def worker(tool: str, files: list[str]) -> None:
    import resource

    if tool == "diag":
        import diag.importers.logs  # noqa: F401 - imports (pandas) are not reading
    use0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = use0.ru_utime + use0.ru_stime
    t0 = time.perf_counter()
    if tool == "regex":
        n = 0
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if "iteration" in line and ITER.search(line):
                        n += 1
        out = {"records": n}
    else:
        from diag.importers.logs import import_log, merge_parts

        parts: dict = {}
        for path in files:
            for kind, df in import_log(path).frames.items():
                parts.setdefault(kind, []).append(df)
        merge_parts(parts)
        out = {"records": int(sum(len(df) for df in parts.get("log_step", [])))}
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "secs": time.perf_counter() - t0,
                "cpu": use.ru_utime + use.ru_stime - cpu0,
                "peak_rss": use.ru_maxrss * 1024,
                **out,
            }
        )
    )


def measure(tool: str, files: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    if tool == "wc":  # timed from here: a process start is noise next to reading the files
        t0 = time.perf_counter()
        subprocess.run(["wc", "-l", *files], capture_output=True, check=True, timeout=3600)
        return {"secs": time.perf_counter() - t0, "cpu": time.perf_counter() - t0}
    cmd = [sys.executable, "-m", "bench.logs", "--worker", tool, *files]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True, timeout=3600)
    return json.loads(r.stdout.strip().splitlines()[-1])


def public_table(folder: str) -> None:
    """What diag reads from each real log, next to a grep of the same file."""
    from diag.importers import load_inputs

    print(
        f"\n{'log':46s} {'iterations':>10s} {'diag steps':>10s} {'last it.':>8s} {'diag last':>9s} "
        f"{'skipped':>7s} {'diag ov':>7s} {'world':>5s} {'diag world':>10s}"
    )
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        text = open(path, encoding="utf-8", errors="replace").read()
        its = [int(m) for m in re.findall(r"\biteration\s+(\d+)/\s*\d+ \|", text)]
        its += [int(m) for m in re.findall(r"\] step=(\d+), skipped", text) if int(m) > 0]
        total = re.search(r"Total optimization steps = (\d+)", text)
        if total:  # the HF Trainer's training bar: `| 3/16 [`
            bar = re.findall(r"\| *(\d+)/(\d+) \[", text)
            its += [int(a) for a, b in bar if b == total.group(1) and int(a)]
        skipped = sum(int(m) for m in re.findall(r"number of skipped iterations:\s*(\d+)", text))
        ds_skip = [int(m) for m in re.findall(r"step=\d+, skipped=(\d+)", text)]
        skipped = skipped or (max(ds_skip) if ds_skip else 0)
        world = re.search(r"(?:using world size:|dist_world_size=|world_size \.+)\s*(\d+)", text)
        trace = load_inputs([path])
        log = trace.frame("log_step")
        diag_world = trace.layout().get("world_size")
        ov = int(trace.overflow["overflow"].astype(bool).sum()) if not trace.overflow.empty else 0
        print(
            f"{name[:46]:46s} {len(set(its)):10d} {len(log):10d} {max(its, default=0):8d} "
            f"{int(log['step'].max()) if len(log) else 0:9d} {skipped:7d} {ov:7d} "
            f"{world.group(1) if world else '-':>5s} {'-' if diag_world is None else diag_world!s:>10s}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--keep", help="write the input here and keep it")
    p.add_argument("--public", help="a folder of real public logs: print what diag reads from each")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.worker:
        worker(args.worker, rest)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        size = make_input(folder, args.mb, args.nodes)
        files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".log"))
        print(f"input: {len(files)} node logs, {size / 2**20:.0f} MiB")
        results = {tool: measure(tool, files) for tool in ("wc", "regex", "diag")}
        for tool, r in results.items():
            mbs = size / 2**20 / r["cpu"]
            rss = f"  peak RSS {r['peak_rss'] / 2**20:7.1f} MiB" if "peak_rss" in r else ""
            ratio = r["cpu"] / results["wc"]["cpu"]
            print(
                f"{tool:6s} wall {r['secs']:7.2f} s  cpu {r['cpu']:7.2f} s  {mbs:7.1f} MiB/s of cpu  "
                f"{ratio:6.1f}x wc -l{rss}" + (f"  records {r['records']}" if "records" in r else "")
            )
        print(
            f"diag / regex pass: {results['diag']['cpu'] / results['regex']['cpu']:.1f}x the cpu time; "
            f"diag peak RSS / input: {results['diag']['peak_rss'] / size:.2f}"
        )
    if args.public:
        public_table(args.public)
    return 0


if __name__ == "__main__":
    sys.exit(main())
