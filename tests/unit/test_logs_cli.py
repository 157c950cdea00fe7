"""`diag analyze LOG --json` as a user runs it (a subprocess): what the log import finds reaches the
report (steps, overflows, layout, ranks), and a crashed job is a one-line error with exit code 1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.unit.kineto_samples import ROOT

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logs")


def _analyze(*paths: str) -> tuple[int, dict, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    r = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", *paths, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout), r.stderr


def test_deepspeed_log_overflows_steps_and_layout_reach_the_report():
    code, doc, err = _analyze(os.path.join(FIX, "ds_fp16_every_rank_overflow.log"))
    assert code == 0 and err == ""
    assert doc["summary"]["overflows"] == 20 and doc["ranks"] == [0, 1]
    assert doc["layout"]["world_size"] == 2
    steps = doc["summary"]["steps"]
    assert steps["count"] == 2 and steps["median_ms"] == 800.0  # steps 20 and 30, from timestamps


def test_megatron_deepspeed_log_reaches_the_report():
    code, doc, _ = _analyze(os.path.join(FIX, "megatron_deepspeed_tp2_pp2.log"))
    assert code == 0
    assert doc["summary"]["steps"]["count"] == 6 and doc["summary"]["steps"]["max_ms"] == 1420.9
    assert doc["summary"]["overflows"] == 2 and doc["summary"]["tflops_median"] == 0.01
    assert {k: doc["layout"][k] for k in ("world_size", "tp", "pp", "dp", "zero_stage", "dtype")} == {
        "world_size": 4,
        "tp": 2,
        "pp": 2,
        "dp": 1,
        "zero_stage": 1,
        "dtype": "fp16",
    }
    assert doc["layout"]["micro_batch"] == 1 and doc["layout"]["global_batch"] == 4
    assert doc["ranks"] == [0, 1, 2, 3]
    assert [s["step"] for s in doc["metrics"]["step_times"]] == [1, 2, 3, 4, 5, 6]
    # the log's `loss scale: -1.0` is not a scale: the report's loss scale comes from the overflow lines
    assert [x["loss_scale"] for x in doc["metrics"]["loss_scale"]] == [2**32, 2**31, 2**30]


def test_crashed_job_exits_1_with_the_statement():
    path = os.path.join(FIX, "crash_16ranks_before_step1.log")
    code, doc, err = _analyze(path)
    assert code == 1
    (line,) = err.splitlines()
    assert line.startswith(
        f"diag analyze: error: {path}:9: job failed before step 1: RuntimeError on "
        "rank(s) 0-15 (first: rank 11, line 9)"
    )
    (problem,) = doc["problems"]
    assert problem["line"] == 9 and "job failed before step 1" in problem["message"]
    assert doc["ranks"] == list(range(16)) and doc["layout"]["world_size"] == 16


def test_unreadable_input_still_exits_2_next_to_a_crash(tmp_path):
    bad = tmp_path / "blob.log"
    bad.write_bytes(bytes(range(256)) * 8)
    code, doc, err = _analyze(os.path.join(FIX, "oom_megatron_after_step3.log"), str(bad))
    assert code == 2 and len(err.splitlines()) == 2 and len(doc["problems"]) == 2
    assert "CUDA out of memory on rank(s) 2" in err


def test_node_logs_of_one_job_merge_by_rank(tmp_path):
    shutil.copy(os.path.join(FIX, "megatron_lm_fp16.log"), tmp_path / "node0.log")
    (tmp_path / "node1.log").write_text(
        "[Rank 4] (after 10 iterations) memory (MB) | allocated: 9000.0 | max allocated: 11000.0 | "
        "reserved: 12000.0 | max reserved: 12000.0\n"
    )
    code, doc, _ = _analyze(str(tmp_path))
    assert code == 0 and doc["ranks"] == list(range(8))
    assert doc["summary"]["steps"]["count"] == 3 and doc["summary"]["overflows"] == 4


def test_per_rank_logs_of_one_job_count_each_step_once(tmp_path):
    """torchrun --log-dir style: one file per rank, each with the every-rank overflow lines and
    rank 0's with the progress lines too: 20 skipped steps, 3 step records, not 2x."""
    src = os.path.join(FIX, "ds_fp16_every_rank_overflow.log")
    lines = open(src).read().splitlines()
    shutil.copy(src, tmp_path / "rank0.log")
    (tmp_path / "rank1.log").write_text("\n".join(x for x in lines if "Skipping step" in x) + "\n")
    code, doc, _ = _analyze(str(tmp_path))
    assert code == 0 and doc["summary"]["overflows"] == 20 and doc["summary"]["steps"]["count"] == 2
