"""Streaming a Kineto rank file: diag's scanner (cut the pretty-printed event array at event
boundaries, parse each few-MB chunk with orjson) vs ijson's C backend (yajl2_c) event by event,
both reduced to the importer's columns (`kineto_events._frames`, 50,000 events at a time).

    python -m bench.kineto_parse FILE.json      (needs `pip install ijson`; not a diag dependency)

Each parser runs in its own process: CPU seconds and peak RSS, printed side by side with the ratio.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from typing import Any


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _scanner(path: str) -> int:
    from diag.importers.kineto_events import read_events

    return sum(len(v) for v in read_events(path)[1].values())


def _ijson(path: str) -> int:
    import ijson

    from diag.importers.kineto_events import _frames

    batch: list[Any] = []
    kept = 0
    with open(path, "rb") as f:
        for e in ijson.items(f, "traceEvents.item", use_float=True):
            batch.append(e)
            if len(batch) >= 50_000:
                kept += sum(len(v) for k, v in _frames(batch).items() if k != "bad")
                batch = []
    return kept + sum(len(v) for k, v in _frames(batch).items() if k != "bad")


def worker(name: str, path: str) -> None:
    t = _cpu()
    kept = {"scanner": _scanner, "ijson": _ijson}[name](path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"cpu": _cpu() - t, "kept": kept, "peak": peak}))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        worker(argv[1], argv[2])
        return 0
    path = argv[0]
    got = {}
    for name in ("scanner", "ijson"):
        out = subprocess.run(
            [sys.executable, "-m", "bench.kineto_parse", "--worker", name, path], capture_output=True
        )
        if out.returncode:
            print(f"{name}: failed ({out.stderr.decode().strip().splitlines()[-1:]})")
            return 1
        got[name] = json.loads(out.stdout)
        r = got[name]
        print(
            f"{name:8s} {r['kept']} events kept  CPU {r['cpu']:6.2f} s  peak RSS {r['peak'] / 2**20:6.0f} MiB"
        )
    print(f"ijson / scanner CPU: {got['ijson']['cpu'] / got['scanner']['cpu']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
