"""GPU-health sidecar: samples every local GPU through NVML and appends `gpu` events to
`<trace_dir>/gpu-<host>.jsonl` (its own header, `"sidecar": "nvml"`), which `diag.load` reads with
the rank files. It runs outside the training job (from `diag top`, or one per node with
`python -m diag.nvml <trace_dir>`), so it may import pynvml.

Without a GPU (`nvmlInit()` raises NVMLError_LibraryNotFound) `Sidecar.start()` returns False and
`Sidecar.error` says "NVML not found": callers show that once and carry on.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from types import ModuleType
from typing import Any

from diag.nvml.sample import GpuReader, XidWatch
from diag.nvml.seam import Nvml, load_module, value
from diag.schema import SCHEMA_VERSION
from diag.thread_name import name_this_thread
from diag.trace.writer import TraceFileWriter

INTERVAL_S = 1.0


class Sidecar:
    """A daemon thread writing one sample per GPU every `interval` seconds."""

    def __init__(
        self,
        trace_dir: str,
        interval: float = INTERVAL_S,
        module: ModuleType | None = None,
        host: str | None = None,
    ) -> None:
        self.trace_dir, self.interval = trace_dir, interval
        self.host = host or socket.gethostname()
        self.nv = Nvml(module if module is not None else load_module())
        self.readers: list[GpuReader] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: TraceFileWriter | None = None
        self._xids: XidWatch | None = None

    @property
    def error(self) -> str | None:
        return self.nv.error

    def start(self) -> bool:
        """Open NVML and the file, start sampling; False (with `error`) when there is no GPU."""
        if not self.nv.start():
            return False
        count = value(self.nv.query("nvmlDeviceGetCount")) or 0
        self.readers = [GpuReader(self.nv, i) for i in range(count)]
        self._xids = XidWatch(self.nv, self.readers)
        self._file = TraceFileWriter(self.trace_dir, f"gpu-{self.host}.jsonl")
        self._file.write_objects([self.header()])
        self._thread = threading.Thread(target=self._run, name="diag-nvml", daemon=True)
        self._thread.start()
        return True

    def header(self) -> dict[str, Any]:
        return {
            "k": "header",
            "schema": SCHEMA_VERSION,
            "sidecar": "nvml",
            "rank": None,
            "host": self.host,
            "pid": os.getpid(),
            "start_ts": time.time_ns(),
            "driver": value(self.nv.query("nvmlSystemGetDriverVersion")),
            "gpus": [r.name for r in self.readers],
        }

    def sample_once(self) -> list[dict[str, Any]]:
        xids = self._xids.drain() if self._xids else {}
        recs = [dict(r.sample(xids.get(r.index)), host=self.host) for r in self.readers]
        if self._file is not None:
            self._file.write_objects(recs)
        self.samples += 1
        return recs

    def _run(self) -> None:
        """A sample at once, then one an interval until stopped: a sidecar stopped before its thread
        first ran (a loaded machine) still has its first sample."""
        name_this_thread()
        while True:
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - a sidecar must outlive a driver hiccup
                pass
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._xids is not None:
            self._xids.close()
        self.nv.stop()
        if self._file is not None:
            self._file.close()
            self._file = None


def selfcheck(trace_dir: str | None = None, module: ModuleType | None = None) -> int:
    """For a GPU machine: read every field twice (NVLink rates need two samples) and print them,
    plus the NVML functions that were unavailable. Returns 0 when at least one GPU was sampled."""
    import tempfile

    car = Sidecar(trace_dir or tempfile.mkdtemp(prefix="diag-nvml-"), module=module)
    if not car.start():
        print(f"no NVIDIA GPU ({car.error})")
        return 1
    try:
        print(f"driver {car.header()['driver']}, {len(car.readers)} GPU(s): {[r.name for r in car.readers]}")
        car.sample_once()
        time.sleep(0.5)
        for rec in car.sample_once():
            for key, val in rec.items():
                print(f"  gpu{rec['index']} {key:>14} = {val!r}")
        print(f"unavailable NVML functions: {sorted(car.nv.missing) or 'none'}")
        print(f"trace file: {car._file.path if car._file else None}")
    finally:
        car.stop()
    return 0 if car.readers else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diag.nvml", description=__doc__)
    p.add_argument("trace_dir", nargs="?", help="write gpu-<host>.jsonl here (default: selfcheck)")
    p.add_argument("--interval", type=float, default=INTERVAL_S)
    args = p.parse_args(argv)
    if not args.trace_dir:
        return selfcheck()
    car = Sidecar(args.trace_dir, args.interval)
    if not car.start():
        print(f"no NVIDIA GPU ({car.error})")
        return 1
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        car.stop()


if __name__ == "__main__":
    raise SystemExit(main())
