"""The straggler rule prices its finding as a what-if replay (issue 17): per step, the time the
others waited for the slow rank, at most its excess, summed over the steps. And on GPU traces whose
collective waits are host noise (issue 11's kineto_gloo_dp), it names the rank whose compute kernels
take longer on the same kernels."""

from __future__ import annotations

import pandas as pd
import pytest
from diag.analyzers.straggler import what_if

from tests.unit.synth_trace import MS, Job, fired


def _blocking(slow_ms: float) -> Job:
    """Rank 1 works `slow_ms` longer a step; rank 0 waits for it in a blocking all-reduce (5 ms of
    transfer)."""
    job = Job(steps=10, step_ms=110)
    for s in range(job.steps):
        job.comm(0, s, at_ms=40, dur_ms=5 + slow_ms)
        job.comm(1, s, at_ms=40 + slow_ms, dur_ms=5)
    return job


def test_time_lost_is_the_others_wait_summed_over_the_steps(tmp_path):
    (f,) = fired(_blocking(60).write(str(tmp_path)), "straggler")
    # steps 1-9 compared (step 0 is warm-up): 60 ms lost on each, of 9 x 110 ms
    assert f.evidence["time_lost_s"] == pytest.approx(9 * 0.060, abs=1e-6)
    assert f.evidence["time_at_stake_s"] == pytest.approx(9 * 0.110, abs=1e-6)
    assert f.evidence["affected_steps"] == list(range(1, 10))
    assert f.severity == "critical"  # 55% of the steps' time
    assert f.recoverable_s == pytest.approx(0.060, abs=1e-6)
    assert "costs 540.0 ms of 990.0 ms over 9 steps (55%)" in f.detail


def test_what_if_takes_the_lesser_of_excess_and_wait():
    wait = pd.DataFrame(
        {"rank": [0, 0, 0, 1, 1, 1], "step": [1, 2, 3, 1, 2, 3], "wait_s": [0.02, 0.08, 0.05, 0, 0, 0.04]}
    )
    gap = pd.Series({1: 0.06, 2: 0.06, 3: -0.01})
    # step 1: rank 0 waited 20 ms of rank 1's 60 ms excess (it was busy itself); step 2: 60 of 80 ms
    # waited (the rest was not rank 1's doing); step 3: rank 1 no slower, nothing lost
    assert what_if(wait, gap, slow=1).round(6).to_dict() == {1: 0.02, 2: 0.06, 3: 0.0}


def _gpu(tmp_path, rank1_ms: float, rank1_kernels: int = 10, name: str = "gemm") -> object:
    """4 profiled steps, one all-reduce each, whose waits swing between the ranks (host noise:
    rank 0 waits 3 ms on odd steps, rank 1 on even ones), and 10 compute kernels of 1 ms on rank 0
    against `rank1_kernels` of `rank1_ms` (+ 0.01 ms a step) on rank 1."""
    job = Job(steps=4, step_ms=30)
    for s in range(job.steps):
        job.comm(0, s, at_ms=20, dur_ms=5 + (3 if s % 2 else 0))
        job.comm(1, s, at_ms=20, dur_ms=5 + (0 if s % 2 else 3))
    trace = job.write(str(tmp_path))
    rows = []
    for r, (n, ms) in enumerate([(10, 1.0), (rank1_kernels, rank1_ms)]):
        for s in range(job.steps):
            for i in range(n):
                dur = int((ms + (0.01 * s if r else 0)) * MS)
                ts = job.start(r, s) + i * int(1.5 * MS)
                kname = name if r else "gemm"
                rows.append(
                    {
                        "rank": r,
                        "name": kname,
                        "kind": "compute",
                        "stream": 7,
                        "ts": ts,
                        "dur": dur,
                        "correlation": len(rows),
                        "launch_ts": ts,
                        "launch_dur": 10_000,
                        "step": s,
                    }
                )
    trace.frames["kernel"] = pd.DataFrame(rows)
    return trace


def test_gpu_straggler_from_compute_kernels(tmp_path):
    (f,) = fired(_gpu(tmp_path, rank1_ms=1.4), "straggler")
    assert f.ranks == [1] and f.evidence["steps_compared"] == 3
    assert f.evidence["ratio"] == pytest.approx(1.42, abs=0.01)
    # rank 0 waited 3 ms on steps 1 and 3 (less than rank 1's 4 ms excess), rank 1 on step 2
    assert f.evidence["time_lost_s"] == pytest.approx(0.006, abs=1e-6)
    assert f.evidence["affected_steps"] == [1, 3]


def test_gpu_ranks_even_or_doing_different_work_are_silent(tmp_path):
    assert fired(_gpu(tmp_path / "even", rank1_ms=1.0), "straggler") == []
    # more and other kernels on rank 1 (a pipeline's last stage, rank 0's logging): its role, no straggler
    assert fired(_gpu(tmp_path / "role", rank1_ms=1.0, rank1_kernels=14), "straggler") == []
    assert fired(_gpu(tmp_path / "other", rank1_ms=1.4, name="loss_kernel"), "straggler") == []
