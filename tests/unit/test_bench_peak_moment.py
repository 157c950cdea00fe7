"""`bench.peak_moment` runs `diag analyze` under tracemalloc and names the diag frames where the
traced peak grew: its last line is a moment inside diag's code, its peak the process's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_peaks_moment_is_named_by_diag_frames():
    sample = os.path.join(ROOT, "sample_traces", "ddp_contention")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.peak_moment", "--last", "3", "analyze", "--json", sample],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.lstrip().startswith("{")  # the report itself, as diag wrote it
    peak = float(re.search(r"traced peak ([\d.]+) MiB", proc.stderr).group(1))
    lines = proc.stderr.strip().splitlines()[-3:]
    tops = [float(line.split()[0]) for line in lines]
    assert tops == sorted(tops) and 0 < tops[-1] <= peak, proc.stderr
    assert all(re.search(r"\w+:\d+", line) for line in lines), lines  # frames: name:line
