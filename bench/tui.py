"""`diag top` at 256 (or 1,024) synthetic ranks refreshed at 1 Hz: the UI's CPU use and latency.

A synthetic job appends one step per rank per second to 256 rank files (a real 256-rank job does
not fit a 2-core machine); the app follows the directory live, headless, at its default 1 s
interval. Printed: CPU seconds of the UI per wall second (the writer's own CPU subtracted) and per
refresh (the same figure where the machine keeps up; on a loaded machine refreshes arrive late,
stretching the wall time, so the per-refresh figure is the one to compare with the 1 s period), the
worker's time per refresh (poll + ingest + view), the UI thread's time per refresh (table cell
updates), and write-to-screen latency, as fractions of the 1 s refresh period. The bench waits for
each view with asyncio.sleep, not Pilot.pause: a pause posts a callback to every widget and renders
the screen, 100 times a second, and that harness cost was most of the CPU it reported.

    python -m bench.tui [--ranks 256] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from diag.tui.app import TopApp
from diag.tui.pump import run_analyzers
from diag.tui.source import LiveSource
from tests.tui.synth import SynthJob


def _p(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def measure(ranks: int, seconds: int, interval: float, analyze: bool = False) -> dict[str, float]:
    d = tempfile.mkdtemp(prefix="diag-bench-tui-")
    job = SynthJob(d, ranks, slow_rank=3)
    app = TopApp(LiveSource(d), analyze=run_analyzers if analyze else None, interval=interval)
    writer_cpu, latencies = 0.0, []
    async with app.run_test(size=(160, 50)) as pilot:
        cpu0, wall0 = time.process_time(), time.monotonic()
        for step in range(seconds):
            c = time.process_time()
            job.write_step(step)
            writer_cpu += time.process_time() - c
            written = time.monotonic()
            while app.view is None or app.view.last_step != step:
                await asyncio.sleep(0.01)  # not pilot.pause: it forces a screen render each call
            latencies.append(time.monotonic() - written)
            await pilot.pause(max(0.0, written + interval - time.monotonic()))
        cpu, wall = time.process_time() - cpu0 - writer_cpu, time.monotonic() - wall0
        rows = app.query_one("#ranks-table").row_count
    job.close()
    shutil.rmtree(d, ignore_errors=True)
    return {
        "ranks": rows,
        "cpu_per_wall": cpu / wall,
        "cpu_per_refresh": cpu / seconds,
        "tick_p50": _p(app.pump.tick_s, 0.5),
        "tick_p95": _p(app.pump.tick_s, 0.95),
        "apply_p50": _p(app.apply_s, 0.5),
        "apply_p95": _p(app.apply_s, 0.95),
        "latency_p50": statistics.median(latencies),
        "latency_p95": _p(latencies, 0.95),
        "events": app.model.events,
        "interval": interval,
        "analyses": app.pump.analyses,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--analyze", action="store_true", help="run the analyzers too, as diag top does")
    a = p.parse_args()
    r = asyncio.run(measure(a.ranks, a.seconds, a.interval, a.analyze))
    per = r["interval"]
    print(
        f"diag top, {r['ranks']} ranks, {r['events']} events over {a.seconds} refreshes, "
        f"{r['analyses']} analyses (every max(10 s, 10x the last one's CPU))"
    )
    print(f"  UI CPU use:               {r['cpu_per_wall']:.2f} core-seconds per second")
    print(
        f"  UI CPU per refresh:       {r['cpu_per_refresh']:.2f} core-seconds "
        f"({r['cpu_per_refresh'] / per:.2f} of the period; goal < 0.5)"
    )
    print(
        f"  worker per refresh:       p50 {r['tick_p50'] * 1e3:.1f} ms, p95 "
        f"{r['tick_p95'] * 1e3:.1f} ms ({r['tick_p95'] / per:.3f} of the period)"
    )
    print(
        f"  UI apply per refresh:     p50 {r['apply_p50'] * 1e3:.1f} ms, p95 "
        f"{r['apply_p95'] * 1e3:.1f} ms ({r['apply_p95'] / per:.3f} of the period)"
    )
    print(
        f"  written -> shown latency: p50 {r['latency_p50'] * 1e3:.0f} ms, p95 "
        f"{r['latency_p95'] * 1e3:.0f} ms ({r['latency_p95'] / per:.2f} of the period)"
    )


if __name__ == "__main__":
    main()
