"""Training-log import speed and memory: diag's log importer next to two references on the same files.

    python -m bench.logs [--mb 200,1000] [--nodes 8] [--chatter N] [--keep DIR] [--public DIR]

Input, for each size in `--mb`: a multi-node log set of one job (one file per node, that many MiB in
all) made of the fixture logs' real formats (tests/fixtures/logs: Megatron-LM iteration and memory
lines, DeepSpeed `step=` / timer / OVERFLOW lines, HF Trainer dicts and progress bars, start-up dumps),
each line behind the launcher's `worker-N: [rankR]:` prefixes. The run is the same at every size
(`RUN_ROUNDS` rounds of the fixtures, the iteration numbers counting on): a larger log set is a larger
job, more ranks per node printing it, so what diag keeps per step should not grow with the bytes.
Nearly every line of that input is one diag reads (the fixtures hold little else); a real log is
mostly lines no reader reads (NCCL INFO, warnings, the model's prints): `--chatter N` puts N such
lines (`CHATTER`, in turn) after each fixture line, so a size holds fewer records.
Each reader runs in its own subprocess, timed after its imports, with its peak RSS:
- `wc -l`: the disk-speed floor (reads every byte, parses nothing; its CPU, best of `WC_RUNS`);
- a plain regex pass: one compiled Megatron iteration regex over every line, keeping (iteration,
  ms, loss): what a user's one-off script does;
- diag: `load_inputs` on the files, as `diag analyze` reads them (all families, overflows, layout,
  failures; one worker process per file up to the cores; the steps merged across files);
- diag's floor, two parts of its own reading with nothing after them: `scan`, the prefilter's keyword
  search (`prefilter.KEY`) on every line but the repeated chatter it skips (what finding the lines a
  reader reads costs, less the launcher prefixes' ranks of the other lines), and `match`,
  that search and then the fast family's regex on each line whose keyword names one (`fastpath`), in
  one process. What diag costs past `match` is Python per line read into records.
Printed per size: MiB, each reader's seconds (CPU, its workers included; wall beside it: the machines
are shared) and diag's ratios to both, diag's peak RSS (main process, and its largest worker), the
floor's two parts as ratios to the regex pass, and diag's CPU past `match` per line it reads (a line
holding a keyword): the Python that turns a line into records.
With `--public DIR`, also a table of what diag read from each log in DIR (real public logs) next to
what a grep of the same file counts (iteration / step lines and the HF training bar's counts, skipped
iterations, the last iteration, world size).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
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


CHATTER = (  # lines of the kinds a real multi-node log is mostly made of, none a reader reads
    "gpu-node-3:4121:4388 [1] NCCL INFO Channel 02/0 : 1[1] -> 2[2] via P2P/CUMEM/read",
    "/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py:1747: FutureWarning: "
    "`torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)`.",
    "gpu-node-3:4121:4390 [1] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "> building train, validation, and test datasets for GPT ...",
)
RUN_ROUNDS = 24  # rounds of the fixtures in the run (each counts the iteration numbers on by 1000)
WC_RUNS = 3  # `wc -l` runs, the best taken (it takes ~0.1 s: one run is mostly the machine's noise)


def _shifter(base: int) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(1) + str(int(m.group(2)) + base)


def make_input(folder: str, mb: int, nodes: int, chatter: int = 0) -> tuple[int, int]:
    """Write `nodes` files of about mb/nodes MiB each; returns (total bytes, ranks)."""
    lines = [
        ln for name in SOURCES for ln in open(os.path.join(FIX, name), encoding="utf-8").read().splitlines()
    ]
    if chatter:
        mixed = []
        for i, ln in enumerate(lines):
            mixed += [ln, *(CHATTER[(i * chatter + j) % len(CHATTER)] for j in range(chatter))]
        lines = mixed
    round_bytes = sum(len(ln) + 40 for ln in lines)
    per = mb * 2**20 // nodes
    per_node = max(1, -(-per // (round_bytes * RUN_ROUNDS)))  # ranks per node: the run once each
    total = 0
    for node in range(nodes):
        path = os.path.join(folder, f"node{node:02d}.log")
        done, rnd = 0, 0
        with open(path, "w", encoding="utf-8") as f:
            while done < per:
                rank = node * per_node + rnd % per_node
                shift = _shifter(rnd // per_node * 1000)
                chunk = "".join(
                    f"worker-{node}: [rank{rank}]: " + _ITER_NUM.sub(shift, ln) + "\n" for ln in lines
                )
                f.write(chunk)
                done += len(chunk.encode())
                rnd += 1
        total += os.path.getsize(path)
    return total, nodes * per_node


def worker(tool: str, files: list[str]) -> None:
    import resource

    if tool != "regex":
        import diag.importers.logs.many  # noqa: F401 - imports (pandas) are not reading

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    cpu0 = cpu()
    t0 = time.perf_counter()
    if tool == "regex":
        n = 0
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if "iteration" in line and ITER.search(line):
                        n += 1
        out = {"records": n}
    elif tool in ("scan", "match"):
        out = {"records": scan(files, tool == "match")}
    else:
        from diag.importers import load_inputs

        trace = load_inputs(files)
        out = {"records": len(trace.frame("log_step")), "ranks": len(trace.headers)}
    secs, used = time.perf_counter() - t0, cpu() - cpu0
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "secs": secs,
                "cpu": used,
                "peak_rss": own.ru_maxrss * 1024,
                "worker_rss": kids.ru_maxrss * 1024,
                **out,
            }
        )
    )


def scan(files: list[str], match: bool) -> int:
    """The lines holding a reader's keyword (`match`: the lines a fast family's regex reads whole), as
    diag's prefilter finds them: binary chunks split at newlines, one search per line but for a short
    line without a keyword seen before (`prefilter.QUIET_KEPT`)."""
    from diag.importers.logs.fastpath import BY_ANCHOR, MEGATRON
    from diag.importers.logs.prefilter import CHUNK, KEY, QUIET_KEPT, QUIET_LINE

    search, n, quiet = KEY.search, 0, set()
    for path in files:
        with open(path, "rb") as f:
            rest = b""
            while data := f.read(CHUNK):
                buf = rest + data
                end = buf.rfind(b"\n") + 1
                for b in buf[:end].split(b"\n"):
                    if b in quiet:
                        continue
                    k = search(b)
                    if k is None:
                        if len(b) <= QUIET_LINE:
                            if len(quiet) >= QUIET_KEPT:
                                quiet.clear()
                            quiet.add(b)
                        continue
                    if not match:
                        n += 1
                        continue
                    for rx in BY_ANCHOR.get(k.group(), ()):
                        if (rx.match if rx is MEGATRON else rx.fullmatch)(b):
                            n += 1
                            break
                rest = buf[end:]
    return n


def _wc(files: list[str], runs: int = WC_RUNS) -> dict[str, float]:
    """`wc -l`'s CPU time (user + system, from the children's rusage) and wall time, the best of
    `runs`: one run's wall time on the 2-core machine was 0.03-0.18 s for the same 200 MiB (the
    ratio to it swung from 51x to 214x on one code), and its CPU is what the other columns give."""
    best = {"secs": float("inf"), "cpu": float("inf")}
    for _ in range(runs):
        before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(["wc", "-l", *files], capture_output=True, check=True, timeout=3600)
        wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        best = {"secs": min(best["secs"], wall), "cpu": min(best["cpu"], cpu)}
    return best


def measure(tool: str, files: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    if tool == "wc":
        return _wc(files)
    cmd = [sys.executable, "-m", "bench.logs", "--worker", tool, *files]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True, timeout=7200)
    return json.loads(r.stdout.strip().splitlines()[-1])


def public_table(folder: str) -> None:
    """What diag reads from each real log, next to a grep of the same file."""
    from diag.importers import load_inputs
    from diag.trace.reader import Unreadable

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
        try:
            trace = load_inputs([path])
        except Unreadable as e:  # a file diag cannot read is a row saying so, not the table's end
            print(f"{name[:46]:46s} {len(set(its)):10d}  unreadable: {str(e)[:120]}")
            continue
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
    p.add_argument("--mb", default="200,1000", help="sizes in MiB, comma-separated")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--chatter", type=int, default=0, help="lines no reader reads after each fixture line")
    p.add_argument("--keep", help="write the input here and keep it")
    p.add_argument("--public", help="a folder of real public logs: print what diag reads from each")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.worker:
        worker(args.worker, rest)
        return 0
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    print(
        f"{'MiB':>5s} {'ranks':>5s} {'wc -l s':>8s} {'regex s':>8s} {'diag s':>8s} {'diag wall':>9s} "
        f"{'diag/wc':>8s} {'diag/regex':>10s} {'diag RSS MiB':>12s} {'worker RSS':>10s} {'steps':>6s} "
        f"{'scan/regex':>10s} {'match/regex':>11s} {'us/line read':>12s}"
    )
    for mb in (int(x) for x in args.mb.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(args.keep, str(mb)) if args.keep else tmp
            os.makedirs(folder, exist_ok=True)
            size, ranks = make_input(folder, mb, args.nodes, args.chatter)
            files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".log"))
            r = {tool: measure(tool, files) for tool in ("wc", "regex", "diag", "scan", "match")}
            d, rx = r["diag"], r["regex"]["cpu"]
            print(
                f"{size / 2**20:5.0f} {ranks:5d} {r['wc']['cpu']:8.2f} {r['regex']['cpu']:8.2f} "
                f"{d['cpu']:8.2f} "
                f"{d['secs']:9.2f} {d['cpu'] / r['wc']['cpu']:7.1f}x {d['cpu'] / rx:9.1f}x "
                f"{d['peak_rss'] / 2**20:12.1f} {d['worker_rss'] / 2**20:10.1f} {d['records']:6d} "
                f"{r['scan']['cpu'] / rx:9.1f}x {r['match']['cpu'] / rx:10.1f}x "
                f"{(d['cpu'] - r['match']['cpu']) / r['scan']['records'] * 1e6:12.2f}",
                flush=True,
            )
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} (after)")
    if args.public:
        public_table(args.public)
    return 0


if __name__ == "__main__":
    sys.exit(main())
