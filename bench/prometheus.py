"""`diag export --prometheus` at scale: the exporter's CPU per step of the job and per scrape, and the
size of a scrape, for one node's ranks (8) and for one exporter over a shared filesystem (1,024).

A synthetic job (tests/tui/synth.py: steps, an all-reduce, memory, loss scale and layers every other
step per rank) appends one step per rank per poll; each poll is the exporter's read + aggregation,
each scrape the text exposition Prometheus fetches. Printed per rank count: poll ms per job step,
scrape ms, series and bytes per scrape, and the CPU a node exporter needs at a 1 s poll with a
15 s scrape interval (core-seconds per second).

    python -m bench.prometheus [--ranks 8,1024] [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from prometheus_client import generate_latest

from diag.exporter.server import Exporter, registry_for
from tests.tui.synth import SynthJob


def measure(ranks: int, steps: int) -> dict[str, float]:
    d = tempfile.mkdtemp(prefix="diag-bench-prom-")
    job = SynthJob(d, ranks, overflow_at=3)
    ex = Exporter(d, "bench", analyze=None)
    registry = registry_for(ex)
    polls, scrapes, body = [], [], b""
    for step in range(steps):
        job.write_step(step)
        t = time.process_time()
        ex.poll_once()
        polls.append(time.process_time() - t)
        t = time.process_time()
        body = generate_latest(registry)
        scrapes.append(time.process_time() - t)
    job.close()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    poll, scrape = statistics.median(polls[1:]), statistics.median(scrapes[1:])
    return {
        "ranks": ranks,
        "poll_ms": poll * 1e3,
        "scrape_ms": scrape * 1e3,
        "series": series,
        "bytes": len(body),
        "cpu": poll + scrape / 15,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="8,1024")
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    print(
        f"{'ranks':>6} {'poll ms/step':>13} {'scrape ms':>10} {'series':>8} {'scrape KiB':>11} "
        f"{'CPU s/s (1 s poll, 15 s scrape)':>32}"
    )
    for n in (int(x) for x in a.ranks.split(",")):
        r = measure(n, a.steps)
        print(
            f"{r['ranks']:>6} {r['poll_ms']:>13.2f} {r['scrape_ms']:>10.2f} {r['series']:>8} "
            f"{r['bytes'] / 1024:>11.1f} {r['cpu']:>32.4f}"
        )


if __name__ == "__main__":
    main()
