"""torchtitan's metrics line (`MetricsProcessor.log`): read as a step record, where diag did not take
the file for a log at all ("not a diag trace ...": pytorch/torchtitan#2389's and #3393's logs). The
fixture is written in the format torchtitan prints (its ANSI colours included, torchrun's `[rank0]:`
prefix, a validation line)."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from diag.importers import detect
from diag.importers.logs import import_log
from diag.importers.logs.records import GB

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logs", "torchtitan_llama3_fsdp.log")
LINE = "[titan] 2025-06-02 10:00:{:02d},000 - root - INFO - step: {:2}  loss: {:7.4f}  {}"


def test_metrics_lines_become_steps_with_their_figures() -> None:
    res = import_log(FIX)
    st = res.frames["log_step"].set_index("step")
    assert list(st.index) == [1, 10, 20, 30, 40, 50]
    assert list(st["loss"]) == [12.2541, 9.8816, 8.1047, 7.3302, 6.9158, 6.6017]
    assert st.loc[20, "grad_norm"] == 2.0184 and st.loc[20, "tflops"] == 420.51
    assert st.loc[20, "tokens_per_sec_per_gpu"] == 7263 and st.loc[1, "tokens_per_sec_per_gpu"] == 1182
    assert st.loc[40, "eval_loss"] == 7.0412 and st["eval_loss"].notna().sum() == 1
    # the time between two lines over the steps between them; none for the first line
    assert pytest.approx(st.loc[10, "iter_ms"]) == (65.318 - 44.912) / 9 * 1e3
    assert pytest.approx(st.loc[20, "iter_ms"]) == (87.870 - 65.318) / 10 * 1e3
    # the validation after step 40 is no step's time: torchtitan restarts its timer after it
    assert pytest.approx(st.loc[50, "iter_ms"]) == (42.205 - 19.554) / 10 * 1e3
    assert pd.isna(st.loc[1, "iter_ms"])
    mem = res.frames["memory"]
    assert set(mem["rank"]) == {0} and mem["reserved"].max() == pytest.approx(60.02 * GB)
    assert res.ranks == list(range(8)) and res.problems == []  # the mesh: 8 ranks, rank 0 logs
    lay = {k: res.headers[0].get(k) for k in ("world_size", "tp", "pp", "cp", "dp")}
    assert lay == {"world_size": 8, "tp": 1, "pp": 1, "cp": 1, "dp": 8}
    assert detect.kind_of_file(FIX) == detect.LOG


@pytest.mark.parametrize(
    "line,layout",
    [
        ("Building 3-D device mesh with ['dp_replicate', 'dp_shard', 'tp'], [2, 4, 2]", (16, 2, 1, 8)),
        ("Building 2-D device mesh with ['dp', 'tp'], [4, 2]", (8, 2, 1, 4)),
        (
            "Building device mesh with parallelism: pp=2, dp_replicate=1, dp_shard=4, cp=1, tp=2, ep=1",
            (16, 2, 2, 4),
        ),
    ],
)
def test_the_layout_from_the_device_mesh(tmp_path, line, layout) -> None:
    """(world size, TP, PP, DP): DP is the replicas times the FSDP shards."""
    path = tmp_path / "titan.log"
    path.write_text("[rank0]:[titan] 2025-06-02 10:14:05,402 - root - INFO - " + line + "\n")
    head = import_log(str(path)).headers[0]
    assert (head["world_size"], head["tp"], head["pp"], head["dp"]) == layout


def test_every_rank_printing_the_line_counts_the_step_once(tmp_path) -> None:
    """#2389: eight ranks log the same step with no rank prefix."""
    tail = "grad_norm: 26.6250  memory: 66.91GiB(37.51%)  tps: 10,050  tflops: 314.69  mfu: 13.99%"
    lines = [LINE.format(17, 4, 7.62585, tail)] * 8 + [LINE.format(19, 5, 7.07623, tail)] * 8
    path = tmp_path / "titan.log"
    path.write_text("\n".join(lines) + "\n")
    st = import_log(str(path)).frames["log_step"].set_index("step")
    assert list(st.index) == [4, 5] and st.loc[5, "iter_ms"] == pytest.approx(2000.0)


def test_the_2024_format_without_grad_norm_and_tflops(tmp_path) -> None:
    """torchtitan's first releases: `wps` (tokens per second per device), no grad_norm, no tflops."""
    path = tmp_path / "titan.log"
    path.write_text(LINE.format(1, 1, 10.8765, "memory: 12.40GiB(15.67%)  wps: 3,311  mfu: 9.12%") + "\n")
    st = import_log(str(path)).frames["log_step"].set_index("step")
    assert st.loc[1, "tokens_per_sec_per_gpu"] == 3311 and st.loc[1, "loss"] == 10.8765
    assert pd.isna(st.loc[1, "tflops"]) and pd.isna(st.loc[1, "grad_norm"])


@pytest.mark.parametrize("prefixed", [True, False])
def test_a_nan_loss_fix_names_no_knob_torchtitan_lacks(tmp_path, prefixed) -> None:
    """nan_loss offered ds_config `gradient_clipping` and Megatron's `--clip-grad` to any job: a
    torchtitan log is a training loop of its own (framework `torch`), neither exists there. A log
    whose lines name no rank says nothing of its framework: the DeepSpeed patch is conditional."""
    from diag.analyzers import run_all

    from diag.importers import load_inputs

    text = open(FIX).read().replace("loss:  6.6017", "loss:     nan")
    if not prefixed:
        text = text.replace("[rank0]:", "")
    path = tmp_path / "titan.log"
    path.write_text(text)
    found, failures = run_all(load_inputs([str(path)]))
    (f,) = [f for f in found if f.rule == "nan_loss"]
    assert failures == {} and f.steps == [50] and f.evidence["last_finite"]["step"] == 40
    assert all(not fix.megatron_args for fix in f.fixes)
    if prefixed:
        assert [(fix.ds_config, fix.megatron_args) for fix in f.fixes] == [(None, [])]
    else:
        assert all(fix.summary.startswith("if the job uses DeepSpeed") for fix in f.fixes if fix.ds_config)


def test_an_oom_fix_in_torchtitan_terms(tmp_path) -> None:
    """The OOM fix named DeepSpeed's keys (`train_micro_batch_size_per_gpu`, `zero_optimization.stage`)
    for any log of no family it knew; a torchtitan log gets torchtitan's."""
    text = [
        *open(FIX).read().splitlines()[:6],
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/torchtitan/torchtitan/train.py", line 540, in train_step',
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total"
        " capacity of 79.11 GiB of which 2.07 GiB is free.",
    ]
    path = tmp_path / "titan.log"
    path.write_text("\n".join(text) + "\n")
    fail = import_log(str(path)).frames["log_failure"]
    fix = fail.loc[fail["first"], "fix"].iloc[0]
    assert "local_batch_size" in fix and "zero_optimization" not in fix and "--" not in fix
