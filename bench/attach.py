"""Attach latency per injection strategy: from `diag attach` starting to the first event in the trace.

Target: a plain torch training loop (optimizer steps every ~20 ms, so the steps collector has
something to write) that never heard of diag. Each repetition attaches, waits for the first `step`
event, detaches. Prints median / max per method, for all collectors and for all but `layers`
(whose install pays a one-off torch._dynamo import). Run: python bench/attach.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = """
import time, torch
m = torch.nn.Linear(64, 64); opt = torch.optim.SGD(m.parameters(), lr=1e-3)
print('ready', flush=True)
while True:
    m(torch.randn(8, 64)).sum().backward(); opt.step(); opt.zero_grad(); time.sleep(0.02)
"""
EVENTS = {"step", "comm", "layer", "memory"}


def first_event(trace_dir: str, t0: float, limit: float = 30.0) -> float | None:
    while time.perf_counter() - t0 < limit:
        for name in os.listdir(trace_dir) if os.path.isdir(trace_dir) else []:
            with open(os.path.join(trace_dir, name)) as f:
                if any(json.loads(ln)["k"] in EVENTS for ln in f if ln.endswith("\n")):
                    return time.perf_counter() - t0
        time.sleep(0.005)
    return None


def once(pid: int, method: str, what: str, folder: str) -> tuple[float | None, float, str]:
    trace = tempfile.mkdtemp(dir=folder)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diag",
            "attach",
            str(pid),
            "--method",
            method,
            "--what",
            what,
            "--trace-dir",
            trace,
        ],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    latency = first_event(trace, t0)
    _, err = proc.communicate()
    cli = time.perf_counter() - t0
    if proc.returncode != 0:
        return None, cli, err.strip()
    subprocess.run(
        [sys.executable, "-m", "diag", "detach", str(pid)], cwd=ROOT, check=True, capture_output=True
    )
    return latency, cli, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--methods", default="ptrace,pyinjector,hypno,gdb,remote_exec")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    target = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True, env=env)
    assert target.stdout is not None and target.stdout.readline().strip() == "ready"
    whats = {"all": "steps,layers,comms,memory,overflow", "no layers": "steps,comms,memory,overflow"}
    print(f"{'method':<12} {'collectors':<10} {'first event median':>19} {'max':>7} {'cli done':>9}")
    try:
        with tempfile.TemporaryDirectory() as folder:
            for method in args.methods.split(","):
                for label, what in whats.items():
                    runs = [once(target.pid, method, what, folder) for _ in range(args.reps)]
                    lat = [r[0] for r in runs if r[0] is not None]
                    if not lat:
                        print(f"{method:<12} {label:<10} failed: {runs[0][2][:90]}")
                        break
                    cli = statistics.median(r[1] for r in runs)
                    print(
                        f"{method:<12} {label:<10} {statistics.median(lat):>17.3f} s "
                        f"{max(lat):>5.2f} s {cli:>7.2f} s"
                    )
    finally:
        target.kill()
        target.wait()


if __name__ == "__main__":
    main()
