"""`python -m bench.windowed --diag-trace 8x1000,8x4000 --window 100`: what `metrics.windowed`
keeps per rank-step against the frames `load_trace` holds, and the CPU seconds of the figures
computed window by window against the whole trace's (`Metrics`), side by side on one trace, each
way twice (whole, windows, whole, windows). The windows are cut from the loaded trace as the
lock-step reader would give them (`Window.frames`); cutting them is not timed."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator

import pandas as pd

from bench.analyze import make_diag_input
from diag.metrics.stage import Metrics
from diag.metrics.windowed import Figures, Windowed
from diag.trace.model import Trace
from diag.trace.reader import load_trace
from diag.trace.window import Window

FIGURES = (
    "steps",
    "steady_steps",
    "step_times",
    "exposed",
    "blocked",
    "collectives",
    "stragglers",
    "step_split",
)


def _bytes(frames: dict[str, pd.DataFrame]) -> int:
    return int(sum(df.memory_usage(deep=True).sum() for df in frames.values()))


def whole(trace: Trace) -> float:
    """CPU seconds of `Metrics`' figures that `Windowed` gives."""
    t = time.process_time()
    m = Metrics(trace)
    for name in (*FIGURES, "median_step_s", "breakdown", "overlap"):
        getattr(m, name)
    m.select()
    m.comm_per_step()
    m.union_per_step()
    return time.process_time() - t


def windows(trace: Trace, size: int, steps: int) -> Iterator[Trace]:
    for lo in range(0, steps, size):
        yield Trace(headers=trace.headers, frames=Window(None, lo, lo + size).frames(trace.frames))


def windowed(trace: Trace, size: int, steps: int) -> tuple[float, Windowed, Figures, int]:
    """(CPU seconds of adding the windows and `done`, the accumulator, its figures, the largest
    window's frames in bytes)."""
    acc, cpu, largest = Windowed(), 0.0, 0
    for w in windows(trace, size, steps):
        largest = max(largest, _bytes(w.frames))
        t = time.process_time()
        acc.add(w)
        cpu += time.process_time() - t
    t = time.process_time()
    figures = acc.done(Trace(headers=trace.headers))
    return cpu + time.process_time() - t, acc, figures, largest


def run(ranks: int, steps: int, size: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        size_in = make_diag_input(tmp, ranks, steps)
        trace = load_trace(f"{tmp}/traces")
    cells = ranks * steps
    cpu = [whole(trace)]
    took, acc, got, largest = windowed(trace, size, steps)
    cpu += [took, whole(trace), windowed(trace, size, steps)[0]]
    m = Metrics(trace)
    for name in FIGURES:
        pd.testing.assert_frame_equal(getattr(got, name), getattr(m, name), rtol=1e-12, obj=name)
    kept = acc.kept()
    frames = _bytes(trace.frames)
    print(f"{ranks} x {steps} (input {size_in / 2**20:.0f} MiB), windows of {size} steps")
    print(f"  frames load_trace holds: {frames / 2**20:.1f} MiB, {frames / cells:,.0f} B a rank-step")
    print(f"  largest window's frames: {largest / 2**20:.1f} MiB")
    held = sum(kept.values())
    print(f"  kept by Windowed: {held / 2**20:.2f} MiB, {held / cells:,.0f} B a rank-step")
    print("    " + ", ".join(f"{k} {v / cells:,.1f}" for k, v in kept.items()))
    print(f"  CPU s whole / windows / whole / windows: {' / '.join(f'{c:.2f}' for c in cpu)}")
    print(f"  windows vs whole: {(cpu[1] + cpu[3]) / (cpu[0] + cpu[2]):.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--diag-trace", default="8x1000", help="RxS[,RxS...]: ranks x steps, tiled")
    p.add_argument("--window", type=int, default=100, help="steps a window")
    args = p.parse_args()
    for spec in args.diag_trace.split(","):
        ranks, steps = (int(v) for v in spec.lower().split("x"))
        run(ranks, steps, args.window)


if __name__ == "__main__":
    main()
