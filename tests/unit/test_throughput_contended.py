"""A job whose steps slow down because other processes take its host's CPUs (an HF Trainer +
DeepSpeed ZeRO-2 run under the deepspeed launcher on a 2-core host shared with other jobs: the Trainer's
bar went from 240 to 430 ms a step over its last third, the ranks' run-queue wait per step from 127
to 271 ms) is reported by throughput_drop as the host's doing, with the host's fix, from the log and
the trace's `sched` samples together; the same slowdown without that wait keeps the job's fixes."""

from __future__ import annotations

from diag.analyzers import run_all

from diag.importers import load_inputs
from tests.unit.synth_trace import MS, Job

STEPS = 30
SLOW_FROM = 20  # iterations from here on take 200 ms instead of 100


def _log(path: str) -> str:
    """A Megatron-style log: iterations 1..29, the last third twice as slow."""
    with open(path, "w") as f:
        for it in range(1, STEPS):
            ms = 200.0 if it >= SLOW_FROM else 100.0
            f.write(
                f" iteration {it:8d}/{STEPS:8d} | consumed samples: {it * 8:12d} | "
                f"elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 | "
                f"global batch size: 8 | lm loss: {5.0 - it * 0.01:.6E} | loss scale: 1.0 | "
                "number of skipped iterations:   0 | number of nan iterations:   0 |\n"
            )
    return path


def _trace(path: str, late_wait_ms: float) -> str:
    """Two ranks, one `sched` sample per step: 10 ms of run-queue wait a step, `late_wait_ms` from
    SLOW_FROM on (the counter is cumulative, as the kernel's)."""
    job = Job(steps=STEPS, step_ms=100)
    for r in range(2):
        waited = 0.0
        for s in range(STEPS + 1):
            job.add(r, "sched", ts=job.start(r, s), cpu=int(s * 50 * MS), runq=int(waited * MS))
            waited += late_wait_ms if s >= SLOW_FROM else 10.0
    job.write(path)
    return path


def _drop(tmp_path, late_wait_ms: float):
    trace = load_inputs([_trace(str(tmp_path / "trace"), late_wait_ms), _log(str(tmp_path / "train.log"))])
    found, failures = run_all(trace)
    assert failures == {}
    (f,) = [f for f in found if f.rule == "throughput_drop" and "regressed" in f.title]
    return f


def test_a_slowdown_the_wait_for_a_cpu_explains_is_the_hosts(tmp_path):
    f = _drop(tmp_path, late_wait_ms=90.0)
    assert f.severity == "info" and "took their CPUs" in f.detail
    assert abs(f.evidence["runq_rise_ms"] - 80.0) < 1.0
    fixes = " ".join(x.summary for x in f.fixes)
    assert "other CPU-heavy processes" in fixes and "Python-side" not in fixes


def test_the_same_slowdown_without_that_wait_keeps_the_jobs_fixes(tmp_path):
    f = _drop(tmp_path, late_wait_ms=20.0)  # 10 ms more a step of a 100 ms rise: under half
    assert f.severity != "info" and "runq_rise_ms" not in f.evidence and "CPU" not in f.detail
    assert any("growing" in x.summary for x in f.fixes)
