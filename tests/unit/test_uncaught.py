"""A job that dies of an exception says so in its trace (`uncaught` meta record, diag.agent.uncaught)
and `diag analyze` names it from the trace alone: a public DDP tutorial whose ranks all raised on their
first line read "No findings" before. An interrupt is a stop from outside (info), and the job's own
excepthook, output and exit code are unchanged."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from typing import Any

from diag.analyzers import registered_rules

import diag
from diag import agent, schema
from diag.agent import uncaught
from diag.metrics.stage import Metrics
from tests.workloads import launch

JOB = textwrap.dedent(
    """
    import sys
    from diag import agent
    agent.start(sys.argv[1], what=("steps",))
    import torch
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range({steps}):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()

    def setup():
        raise {exc}

    setup()
    """
)


def _job(tmp_path, exc: str, steps: int = 0) -> tuple[subprocess.CompletedProcess[str], list]:
    script = tmp_path / "train.py"
    script.write_text(JOB.format(exc=exc, steps=steps))
    trace_dir = tmp_path / "trace"
    proc = subprocess.run(
        [sys.executable, str(script), str(trace_dir)], capture_output=True, text=True, timeout=120
    )
    trace = diag.load(str(trace_dir))
    return proc, registered_rules()["job_crash"][0](trace, Metrics(trace))


def test_an_exception_that_ends_the_job_is_named_from_the_trace(tmp_path) -> None:
    proc, found = _job(tmp_path, 'AttributeError("no attribute _cuda_setDevice\\nmore")', steps=4)
    assert proc.returncode == 1 and "AttributeError: no attribute _cuda_setDevice" in proc.stderr  # as before
    (f,) = found
    assert f.severity == "critical" and f.evidence["exception"] == "AttributeError", f
    assert f.evidence["message"] == "no attribute _cuda_setDevice" and f.evidence["last_completed_step"] == 3
    assert f.evidence["where"].endswith("train.py:14 in setup") and f.steps == [4], f.evidence
    assert f.evidence["job_frame"] == f.evidence["where"]
    cli = launch.diag_cli("analyze", str(tmp_path / "trace"))
    assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr
    assert cli.stderr.splitlines() == [f"diag analyze: error: job failed: {f.title}"], cli.stderr


def test_an_interrupt_is_a_stop_from_outside(tmp_path) -> None:
    proc, found = _job(tmp_path, "KeyboardInterrupt()")
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    (f,) = found
    assert f.severity == "info" and "stopped from outside before its first step" in f.title, f.title
    assert launch.diag_cli("analyze", str(tmp_path / "trace")).returncode == 0  # not a failure of the job


def test_a_job_that_ends_well_has_no_record_and_detach_restores_the_hook(tmp_path) -> None:
    before = sys.excepthook
    agent.start(str(tmp_path), what=("steps",))
    assert sys.excepthook is not before
    agent.stop()
    assert sys.excepthook is before
    meta = diag.load(str(tmp_path)).frame(schema.META)
    assert not (meta["key"] == schema.META_UNCAUGHT).any()


def test_an_exception_raised_inside_a_library_names_the_jobs_own_frame(tmp_path) -> None:
    """The public DDP tutorial on a CPU: torch.cuda.set_device raised inside torch; the fix is in the
    job's own line that called it, which the finding names beside where it was raised."""
    _, found = _job(tmp_path, 'ValueError(__import__("json").loads("{"))')
    (f,) = found
    assert f.evidence["exception"] == "JSONDecodeError" and "json" in f.evidence["where"], f.evidence
    assert f.evidence["job_frame"].endswith("train.py:14 in setup"), f.evidence
    assert "called from the job's" in f.detail and "train.py:14" in f.fixes[0].summary


def test_a_generated_init_is_not_the_jobs_own_frame() -> None:
    """HF `TrainingArguments(bf16=True)` on a CPU raised in transformers' `__post_init__`, called from
    the dataclass's generated `__init__` (file `<string>`): the trial's finding said "the job's own code
    at <string>:117 in __init__ led to it". The job's own line is the one that built the arguments."""

    @dataclasses.dataclass
    class Args:
        x: int = 0
        __post_init__ = json.loads  # a library function that raises (TypeError), as transformers' check

    try:
        Args()
    except TypeError as e:
        rec = uncaught.describe(e, e.__traceback__, 0)
    assert rec["where"].split(":")[0].endswith("json/__init__.py"), rec
    name = "in test_a_generated_init_is_not_the_jobs_own_frame"
    assert rec["job_frame"].startswith(__file__) and rec["job_frame"].endswith(name), rec


def _killed_peer(tmp_path: Any, message: str) -> Any:
    """Rank 1's records end at step 5 with no exception (SIGKILLed: its last flush lost); rank 0
    writes on to step 7, then its main thread raises `message` (no trace is closed: the launcher
    ended rank 0 right after)."""
    from tests.unit.synth_trace import MS, Job

    job = Job(steps=8)
    job.each_step(lambda r, s: job.comm(r, s))
    raised_at = job.start(0, 7) + 80 * MS
    value = {"exc": "RuntimeError", "message": message, "where": "torch/autograd/graph.py:979", "step": 8}
    job.add(0, schema.META, ts=raised_at, key=schema.META_UNCAUGHT, value=value)
    path = tmp_path / "killed"
    job.write(str(path))
    rank1 = path / "rank-00001.jsonl"
    kept = [ln for ln in rank1.read_text().splitlines() if json.loads(ln).get("step", 0) <= 5]
    rank1.write_text("\n".join(kept) + "\n")
    return diag.load(str(path))


def test_a_peer_lost_exception_names_the_rank_that_died_first(tmp_path) -> None:
    """The public DDP tutorial with rank 1 SIGKILLed: rank 0 raised gloo's "Read error ...
    Connection reset by peer" (with a "[/__w/...]" that rich once read as markup); the crash is rank
    1's, the exception its consequence. Any other exception stays the cause."""
    from tests.unit.synth_trace import fired

    gloo = (
        "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"
    )
    (f,) = fired(_killed_peer(tmp_path / "a", gloo), "job_crash")
    assert f.ranks == [1] and f.severity == "critical" and "rank 1 died after step 5" in f.title
    assert f.evidence["consequences"]["ranks"] == [0] and "consequence" in f.detail
    (g,) = fired(_killed_peer(tmp_path / "b", "CUDA error: an illegal memory access"), "job_crash")
    assert g.ranks == [0] and "RuntimeError: CUDA error" in g.title
    out = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(tmp_path / "a" / "killed")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "rank 1 died" in out.stdout and "[/__w/pytorch" in out.stdout
