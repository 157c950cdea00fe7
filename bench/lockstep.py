"""Peak memory and CPU of reading a diag trace whole (`load_trace`) vs a window of steps at a time
(`trace.lockstep`), side by side on tiled traces (issue 14, docs/scale.md).

    python -m bench.lockstep [--shapes 8x1000,8x4000] [--window 10] [--keep DIR] [--figures]

Each shape is `bench.analyze.make_diag_input`'s tiling of sample_traces/zero3 (RANKS x STEPS).
Each reading runs in a process of its own (in-process reading: `DIAG_WORKERS=0`), which prints its
own peak RSS (the kernel's high-water mark, VmHWM) and CPU seconds; the windowed reading drops each window
after counting its rows. Both count every kind's rows (the windows' and `outside`'s stepped rows
plus the step-less ones once): the two counts must be equal.

`--figures`: each side also computes the figures `metrics.windowed` gives, `Metrics` on the
trace read whole against `windowed.read` (the lock-step windows reduced as they come), and prints
a digest of each figure: the two digests must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

from bench.analyze import ROOT, make_diag_input


def _rows(frames: dict, stepped_only: bool) -> Counter[str]:
    """Rows per kind (only those of an integer step, with `stepped_only`)."""
    import pandas as pd

    out: Counter[str] = Counter()
    for kind, df in frames.items():
        if stepped_only:
            out[kind] += int(pd.to_numeric(df["step"], errors="coerce").notna().sum()) if "step" in df else 0
        else:
            out[kind] += len(df)
    return out


def _high_water_kib() -> int:
    """The process's peak RSS (VmHWM): `ru_maxrss` also counts the parent's RSS at the fork (the
    kernel keeps the old memory's high-water mark across exec), here the tiled input it built."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def worker(how: str, path: str, window: int) -> None:
    """One reading; prints its rows, peak RSS (KiB) and CPU seconds as JSON."""
    from diag.trace import reader
    from diag.trace.lockstep import LockStep

    rows: Counter[str] | dict[str, str] = Counter()
    windows = 0
    if how.startswith("figures"):  # the two sides' figures, digested: equal or the bench fails
        rows = _figures(how, path, window)
    elif how == "whole":
        rows += _rows(reader.load_trace(path).frames, False)
    else:
        reading = LockStep(path, window)
        for part in reading:
            rows += _rows(part.trace.frames, True)
            windows += 1
            del part
        assert reading.outside is not None
        rows += _rows(reading.outside.frames, False)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "rows": dict(sorted(rows.items())),
                "windows": windows,
                "rss_kib": _high_water_kib(),
                "cpu": usage.ru_utime + usage.ru_stime,
            }
        )
    )


FIGURES = ("steps", "steady_steps", "step_times", "exposed", "blocked", "collectives", "stragglers")
FIGURES += ("step_split",)


def _figures(how: str, path: str, window: int) -> dict[str, str]:
    """A digest of each figure: `Metrics` on the whole trace, or `windowed.read`'s."""
    import hashlib

    from diag.metrics import windowed
    from diag.metrics.stage import Metrics
    from diag.trace import reader

    got = Metrics(reader.load_trace(path)) if how == "figures-whole" else windowed.read(path, window)
    out = {}
    for name in FIGURES:
        df = getattr(got, name)
        # collectives' float sums are regrouped by the windows (equal to rounding): digested rounded
        text = df.round(6).to_csv(index=False) if name == "collectives" else df.to_csv(index=False)
        out[name] = hashlib.sha1(text.encode()).hexdigest()[:12]
    out["median_step_s"] = repr(got.median_step_s)
    return out


def measure(how: str, path: str, window: int) -> dict:
    env = {**os.environ, "DIAG_WORKERS": "0", "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-m", "bench.lockstep", "--worker", how, path, str(window)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8x1000,8x4000", help="RANKSxSTEPS, comma-separated")
    ap.add_argument("--window", type=int, default=10, help="steps a window")
    ap.add_argument("--keep", help="make the traces here and keep them")
    ap.add_argument("--figures", action="store_true", help="also the figures: Metrics vs windowed.read")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return 0
    base = args.keep or tempfile.mkdtemp(prefix="bench-lockstep-")
    peaks: dict[str, list[tuple[int, float]]] = {"whole": [], "windows": []}
    print(f"{'trace':>10} {'input':>9} | {'load_trace':>24} | {f'windows of {args.window}':>24} | CPU ratio")
    try:
        for shape in args.shapes.split(","):
            ranks, steps = (int(x) for x in shape.split("x"))
            folder = os.path.join(base, shape)
            size = make_diag_input(folder, ranks, steps)
            path = os.path.join(folder, "traces")
            whole = measure("figures-whole" if args.figures else "whole", path, args.window)
            windows = measure("figures-windows" if args.figures else "windows", path, args.window)
            if whole["rows"] != windows["rows"]:
                print(f"rows differ: {whole['rows']} vs {windows['rows']}")
                return 1
            for how, r in (("whole", whole), ("windows", windows)):
                peaks[how].append((ranks * steps, r["rss_kib"] / 1024))
            print(
                f"{shape:>10} {size / 2**20:6.0f} MiB | "
                f"{whole['rss_kib'] / 1024:6.0f} MiB {whole['cpu']:7.1f} CPU s | "
                f"{windows['rss_kib'] / 1024:6.0f} MiB {windows['cpu']:7.1f} CPU s | "
                f"{windows['cpu'] / whole['cpu']:.2f}x  ({windows['windows']} windows)",
                flush=True,
            )
            if not args.keep:
                shutil.rmtree(folder)
        for how, pts in peaks.items():
            if len(pts) > 1:
                (n0, m0), (n1, m1) = pts[0], pts[-1]
                print(f"{how}: {(m1 - m0) * 1024 / (n1 - n0):.2f} KB of peak a rank-step added")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
