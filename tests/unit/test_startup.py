"""What the read-only commands load (startup cost: pandas alone is ~0.65 s of CPU on these machines).

`diag export --prometheus` follows the files without pandas/numpy until its first analysis;
`diag analyze --json` of a tiny diag trace loads pandas (the rules are pandas) but never the TUI,
torch, rich (terminal rendering only) or the collectors. Each check runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.synth_trace import Job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = (
    "pandas",
    "numpy",
    "textual",
    "rich",
    "torch",
    "psutil",
    "deepspeed",
    "diag.tui.app",
    "diag.collectors",
    "diag.agent",
)


def loaded_after(code: str) -> set[str]:
    """Which of `HEAVY` a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert out.returncode == 0, out.stderr
    last = (out.stdout.strip().splitlines() or [""])[-1]
    return set(filter(None, last.split(",")))


def test_the_exporter_follows_a_trace_without_pandas() -> None:
    pytest.importorskip("prometheus_client", reason="prometheus-client is the prometheus extra")
    code = (
        "from prometheus_client import generate_latest\n"
        "from diag.exporter.server import Exporter, registry_for\n"
        "ex = Exporter('sample_traces/zero3', 'j', analyze=None)\n"
        "while ex.poll_once(): pass\n"
        "assert b'diag_steps_total' in generate_latest(registry_for(ex))"
    )
    assert loaded_after(code) == set()


def test_analyze_json_of_a_tiny_trace_loads_no_ui_torch_or_agent(tmp_path) -> None:
    job = Job(ranks=2, steps=4)
    job.each_step(lambda r, s: job.comm(r, s))
    job.write(str(tmp_path))
    code = (
        "import contextlib, io\nfrom diag.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['analyze', '--json', {str(tmp_path)!r}]) == 0"
    )
    assert loaded_after(code) == {"pandas", "numpy"}


def test_the_analyze_entry_and_input_detection_load_no_pandas() -> None:
    """`diag analyze` parses its options, finds and sizes its inputs and tells their kinds (the
    progress bar's total, a Kineto file, a Flight Recorder dump) before any frame is built: none of
    that may pull pandas/numpy (0.3 s of a tiny trace's analysis) or multiprocessing."""
    code = (
        "import sys\nimport diag.cli, diag.cli.analyze, diag.importers.parallel\n"
        "from diag.importers import detect, input_files, size_of\n"
        "items, problems = input_files(['sample_traces/kineto_gloo_dp', 'sample_traces/zero3'])\n"
        "assert items and not problems, (items, problems)\n"
        "assert sum(size_of(p) for p, _ in items) > 0\n"
        "kinds = {detect.kind_of_file(p) for p, k in items if k is None}\n"
        "assert detect.KINETO in kinds, kinds\n"
        "assert 'multiprocessing' not in sys.modules"
    )
    assert loaded_after(code) == set()
