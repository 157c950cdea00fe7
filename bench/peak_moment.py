"""Where the main process's traced peak is: `diag ...` under tracemalloc, with the main thread's diag
frames each time the peak grew by a MiB or more (a thread samples them every 5 ms).

    python -m bench.peak_moment analyze --windowed --json TRACE_DIR > /dev/null

Prints the peak (`traced peak`) and the last `--last` growths, each with the peak, the memory in
use then and the innermost diag frames: the last lines name the moment to cut. memray names the
moment of its own high-water mark instead (a malloc-level count: the two can differ by a moment of
about the same height, as at 256 ranks x 2,000 steps: docs/scale.md, session 28)."""

from __future__ import annotations

import runpy
import sys
import threading
import tracemalloc
from types import FrameType

OURS = ("/diag/", "/analyzers/", "/collectors/")
STEP = 1 << 20  # a growth of the peak worth a line
EVERY_S = 0.005
LAST = 25


def diag_frames(frame: FrameType | None, depth: int = 6) -> str:
    out = []
    while frame is not None and len(out) < depth:
        if any(part in frame.f_code.co_filename for part in OURS):
            out.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(out)


class Sampler(threading.Thread):
    """The main thread's diag frames at each growth of tracemalloc's peak by `STEP` or more."""

    def __init__(self) -> None:
        super().__init__(name="peak-moment", daemon=True)
        self.main = threading.main_thread().ident
        self.log: list[tuple[int, int, str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        best = 0
        while not self.done.wait(EVERY_S):
            used, peak = tracemalloc.get_traced_memory()
            if peak >= best + STEP:
                best = peak
                self.log.append((peak, used, diag_frames(sys._current_frames().get(self.main or 0))))


def main(argv: list[str]) -> None:
    last = LAST
    if argv[:1] == ["--last"]:
        last, argv = int(argv[1]), argv[2:]
    tracemalloc.start()
    sampler = Sampler()
    sampler.start()
    sys.argv = ["diag", *argv]
    try:
        runpy.run_module("diag", run_name="__main__")
    except SystemExit:
        pass
    finally:
        sampler.done.set()
        sampler.join()
        peak = tracemalloc.get_traced_memory()[1]
        print(f"traced peak {peak / 2**20:.1f} MiB", file=sys.stderr)
        for top, used, where in sampler.log[-last:]:
            print(f"{top / 2**20:8.1f} {used / 2**20:8.1f}  {where}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
