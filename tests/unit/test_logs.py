"""Training-log import: one fixture per format variant and failure class (tests/fixtures/logs, excerpts
written line for line in the formats DeepSpeed 0.9-0.16, Megatron-LM, Megatron-DeepSpeed, NeMo and the
HF Trainer print), each with the figures the log states; plus the real DeepSpeed log of a sample run."""

from __future__ import annotations

import os

import pytest

from diag.importers.errors import ImportProblem
from diag.importers.logs import JobFailed, import_log
from diag.importers.logs.lines import Line
from diag.ranks import rank_count
from tests.unit.kineto_samples import GPT_DS

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logs")
GiB, MiB = 1 << 30, 1 << 20


def _load(name: str):
    return import_log(os.path.join(FIX, name))


def _steps(res):
    return res.frames["log_step"].set_index("step")


def _layout(res):
    h = res.headers[min(res.headers)]
    return {
        k: v
        for k, v in h.items()
        if k not in ("rank", "source", "host", "log_families", "megatron_args", "ds_config", "model")
    }


# -- the line model -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,rank,host,text",
    [
        ("[rank3]: RuntimeError: boom", 3, None, "RuntimeError: boom"),
        ("[default5]: iteration 1/ 2 |", 5, None, "iteration 1/ 2 |"),
        (
            "worker-1: [rank9]: Traceback (most recent call last):",
            9,
            "worker-1",
            "Traceback (most recent call last):",
        ),
        (
            "10.0.0.2: [2024-01-01 00:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 4] step=10, skipped=0",
            4,
            "10.0.0.2",
            "[2024-01-01 00:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 4] step=10, skipped=0",
        ),
        ("12: steps: 10 loss: 2.0", 12, None, "steps: 10 loss: 2.0"),
        (" iteration   10/   20 | lm loss: 1.0 |", -1, None, " iteration   10/   20 | lm loss: 1.0 |"),
    ],
)
def test_line_prefixes(raw, rank, host, text):
    ln = Line(raw, 1)
    assert (ln.rank, ln.host, ln.text) == (rank, host, text)


@pytest.mark.parametrize(
    "raw,ns",
    [
        ("[2024-03-08 16:30:43,778] [INFO] x", 1709915443_778_000_000),
        (" [2025-10-06 03:27:07] iteration 1/ 2 |", 1759721227_000_000_000),
        ("[NeMo I 2024-06-17 02:10:11 megatron_init:269] x", 1718590211_000_000_000),
        ("no time here", None),
    ],
)
def test_line_timestamps(raw, ns):
    assert Line(raw, 1).ts == ns


# -- DeepSpeed ------------------------------------------------------------------------------------


def test_deepspeed_steps_times_throughput_layout_and_overflows():
    res = _load("ds_zero2_fp16.log")
    st = _steps(res)
    assert list(st.index) == [10, 20, 30]  # step=0 at start-up is not a step
    # no explicit timing: (ts of step=20 - ts of step=10) / 10 steps, from the lines' timestamps
    assert pd_isnan(st.loc[10, "iter_ms"])
    assert st.loc[20, "iter_ms"] == 1500.0 and st.loc[30, "iter_ms"] == 1550.0
    assert st.loc[20, "samples_per_sec"] == 43.10 and st.loc[30, "lr"] == 9.4e-06
    assert st.loc[30, "skipped_total"] == 4
    assert _layout(res) == {
        "world_size": 4,
        "zero_stage": 2,
        "dtype": "fp16",
        "micro_batch": 4,
        "global_batch": 64,
        "grad_accum": 4,
    }
    assert res.ranks == [0, 1, 2, 3] and res.headers[3]["host"] == "localhost"
    ov = res.frames["overflow"]
    # the hysteresis line keeps the scale; 3 in steps 1-10 and 1 in 11-20, as `skipped=` counts
    assert list(ov["step"]) == [1, 2, 3, 11] and list(ov["source"]) == ["log"] * 4
    assert list(zip(ov["scale_before"], ov["scale_after"]))[:2] == [(65536.0, 65536.0), (65536.0, 32768.0)]
    mem = res.frames["memory"].set_index("step")
    assert mem.loc[30, "peak"] == pytest.approx(38.61 * GiB)
    assert mem.loc[0, "reserved"] == pytest.approx(2.55 * GiB)
    assert not res.problems


def pd_isnan(x) -> bool:
    return x != x


def test_every_rank_prints_each_overflow_20_skipped_steps_count_20():
    """2 ranks print each overflow (same timestamp); at the minimum scale 1.0 -> 1.0 repeats on
    successive steps (different timestamps): 20 skipped steps, as `skipped=20` says."""
    res = _load("ds_fp16_every_rank_overflow.log")
    ov = res.frames["overflow"]
    assert len(ov) == 20 and ov["step"].is_unique
    assert list(ov["step"][:8]) == list(range(1, 9))  # before the first progress line: exact
    assert ((ov["step"] > 10) & (ov["step"] <= 20)).sum() == 6 and (ov["step"] > 20).sum() == 6
    assert (ov["scale_after"] == 1.0).sum() == 5
    assert _steps(res).loc[30, "skipped_total"] == 20 and _steps(res).loc[20, "iter_ms"] == 800.0
    assert res.ranks == [0, 1]


def test_rank_prefixed_overflow_lines_count_once_per_step(tmp_path):
    text = "".join(
        f"[rank{r}]: [deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss "
        f"scale: {s}, reducing to {s / 2}\n"
        for s in (1024.0, 512.0)
        for r in range(4)
    )
    text += (
        "[rank0]: [2024-01-01 00:00:10,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, "
        "skipped=2, lr=[0.1]\n"
    )
    path = tmp_path / "x.log"
    path.write_text(text)
    ov = import_log(str(path)).frames["overflow"]
    assert list(ov["step"]) == [1, 2] and list(ov["scale_before"]) == [1024.0, 512.0]


def test_skipped_counter_adds_the_overflows_no_line_printed(tmp_path):
    """Non-verbose optimizers print no overflow line: `skipped=K` alone gives the count."""
    path = tmp_path / "x.log"
    path.write_text(
        "[Rank 0] step=0, skipped=0, lr=[0.1], mom=[0.9]\n"
        "[Rank 0] step=10, skipped=10, lr=[0.1]\n[Rank 0] step=20, skipped=12, lr=[0.1]\n"
    )
    ov = import_log(str(path)).frames["overflow"]
    assert list(ov["step"]) == [*range(1, 11), 11, 12] and set(ov["source"]) == {"log_counter"}


def test_two_engines_in_one_process_count_the_first_engines_skips():
    """DeepSpeed-Chat's RLHF step trains an actor and a critic engine: each prints `step=N, skipped=K`
    (actor 4, critic 3 at step 10): the counters are not one job's, and the first engine's count holds."""
    res = _load("ds_chat_actor_critic.log")
    st = _steps(res)
    assert list(st.index) == [10, 20] and list(st["skipped_total"]) == [4, 4]
    assert list(st["lr"]) == [5.79e-07, 5.79e-07]  # the actor's, not the critic's 3.5e-07
    assert list(res.frames["overflow"]["step"]) == [1, 2, 3, 4]  # not a fifth at 11 from the critic's 3


def test_pipeline_engine_lines():
    res = _load("ds_pipeline.log")
    st = _steps(res)
    assert list(st["iter_ms"]) == [512.0, 498.0, 505.0]  # printed in seconds
    assert list(st["samples_per_sec"]) == [62.5, 64.257, 63.366] and st.loc[30, "loss"] == 2.1077
    assert st.loc[30, "lr"] == 0.001  # the engine's step=30 line merges into the same step
    # the grid from `Using topology` (DeepSpeed 0.19's own print of PipeDataParallelTopology(2, 2))
    assert _layout(res) == {"world_size": 4, "zero_stage": 1, "dtype": "fp16", "pp": 2, "dp": 2, "tp": 1}


def test_pipeline_topology_3d_and_user_axes(tmp_path):
    """Megatron-DeepSpeed's PipeModelDataParallelTopology(pp 2, tp 2, dp 2), as DeepSpeed prints it; a
    user's own axis is no grid size DeepSpeed names, but its ranks are the world."""
    coords = [(p, d, m) for p in range(2) for d in range(2) for m in range(2)]
    three = ", ".join(
        f"ProcessCoord(pipe={p}, data={d}, model={m}): {i}" for i, (p, d, m) in enumerate(coords)
    )
    user = ", ".join(
        f"ProcessCoord(pipe={p}, expert={d}): {i}" for i, (p, d) in enumerate([(0, 0), (0, 1), (1, 0)])
    )
    for text, want in (
        (three, {"world_size": 8, "pp": 2, "dp": 2, "tp": 2}),
        (user, {"world_size": 3, "pp": 2}),
    ):
        path = tmp_path / "x.log"
        path.write_text(
            f"Using topology: {{{text}}}\nsteps: 10 loss: 2.3 iter time (s): 0.5 samples/sec: 8.0\n"
        )
        res = import_log(str(path))
        assert {k: v for k, v in _layout(res).items() if k in want} == want, _layout(res)
        assert set(_layout(res)) == set(want), _layout(res)


def test_real_deepspeed_log_overflows():
    res = import_log(os.path.join(GPT_DS, "train.log"))
    ov = res.frames["overflow"]
    assert res.ranks == [0, 1] and len(ov) == 2
    assert list(zip(ov["scale_before"], ov["scale_after"])) == [(256.0, 128.0), (128.0, 64.0)]
    assert ov["step"].is_monotonic_increasing and ov["step"].is_unique
    assert _layout(res) == {
        "world_size": 2,
        "zero_stage": 1,
        "dtype": "fp16",
        "micro_batch": 4,
        "global_batch": 8,
        "grad_accum": 1,
    }


# -- Megatron family ------------------------------------------------------------------------------


def test_megatron_deepspeed_lines_arguments_and_skipped_iterations():
    res = _load("megatron_deepspeed_tp2_pp2.log")
    st = _steps(res)
    assert list(st.index) == [1, 2, 3, 4, 5, 6]  # Megatron's own iteration numbers
    assert st.loc[1, "loss"] == pytest.approx(10.95071)  # spelled `lm-loss:`
    assert st["loss_scale"].isna().all()  # `loss scale: -1.0`: DeepSpeed manages it
    assert st.loc[3, "iter_ms"] == 1391.0 and st.loc[3, "samples_per_sec"] == 2.876
    assert st.loc[3, "tokens_per_sec_per_gpu"] == 46.013 and st.loc[3, "tflops"] == 0.01
    assert st.loc[3, "grad_norm"] == 3.712 and st.loc[5, "eval_loss"] == pytest.approx(10.93455)
    ov = res.frames["overflow"]
    assert list(ov["step"]) == [1, 2]  # = the iterations with `number of skipped iterations: 1`
    layout = _layout(res)
    assert res.headers[0]["model"] == {
        "data_parallel_size": 1,
        "deepspeed": True,  # the value, as the agent reads it from the args
        "global_batch_size": 4,
        "micro_batch_size": 1,
        "world_size": 4,
    }  # what the TFLOPs formula reads
    assert layout == {
        "world_size": 4,
        "tp": 2,
        "pp": 2,
        "dp": 1,
        "sp": 1,  # `sequence-parallel size: 1` (no DeepSpeed-Ulysses)
        "zero_stage": 1,
        "dtype": "fp16",
        "micro_batch": 1,
        "global_batch": 4,
    }
    mem = res.frames["memory"].iloc[0]
    assert (mem["rank"], mem["step"]) == (0, 1) and mem["peak"] == pytest.approx(60.43310546875 * MiB)


def test_megatron_deepspeed_ulysses_layout_names_the_sequence_parallel_degree():
    """A real Megatron-DeepSpeed pretrain_gpt.py run with `--ds-sequence-parallel-size 2` (DeepSpeed-
    Ulysses, 2 ranks on CPU/gloo; the log trimmed to its layout lines, arguments and iterations): the
    layout read TP=1 PP=1 DP=1 for 2 ranks, the SP degree that makes up the world was dropped."""
    res = _load("megatron_deepspeed_ulysses_sp2.log")
    layout = _layout(res)
    assert layout["sp"] == 2 and (layout["tp"], layout["pp"], layout["dp"]) == (1, 1, 1)
    assert layout["world_size"] == 2 == layout["tp"] * layout["pp"] * layout["dp"] * layout["sp"]
    st = _steps(res)
    assert list(st.index) == list(range(1, 21)) and st.loc[1, "loss"] == pytest.approx(6.975361)
    assert "overflow" not in res.frames  # `number of skipped iterations:   0` on every line


def test_layout_world_size_counts_the_sequence_parallel_degree(tmp_path):
    """Where a log gives sizes but no world size, SP is one of its factors."""
    log = tmp_path / "sp.log"
    log.write_text(
        "------------------------ arguments ------------------------\n"
        "  ds_sequence_parallel_size ....................... 4\n"
        "  data_parallel_size .............................. 2\n"
        "  pipeline_model_parallel_size .................... 1\n"
        "  tensor_model_parallel_size ...................... 1\n"
        "-------------------- end of arguments ---------------------\n"
        " iteration        1/      20 | consumed samples:            2"
        " | elapsed time per iteration (ms): 309.5 | lm loss: 6.975361E+00"
        " | number of skipped iterations:   0 |\n"
    )
    assert _layout(import_log(str(log)))["world_size"] == 8


def test_megatron_lm_interval_counts_and_memory():
    res = _load("megatron_lm_fp16.log")
    st = _steps(res)
    assert list(st["tflops"]) == [143.6, 151.2, 149.4] and st.loc[30, "loss_scale"] == 8192.0
    assert st.loc[20, "iter_ms"] == 4647.8 and st.loc[10, "consumed_samples"] == 5120
    ov = res.frames["overflow"]
    # 3 skipped in iterations 1-10 (log_interval 10), 1 in 21-30: 4, none printed individually
    assert len(ov) == 4 and ov["step"].between(1, 10).sum() == 3 and ov["step"].between(21, 30).sum() == 1
    assert _layout(res) == {
        "world_size": 8,
        "tp": 2,
        "pp": 1,
        "dp": 4,
        "cp": 1,
        "dtype": "fp16",
        "micro_batch": 4,
        "global_batch": 512,
    }
    assert res.ranks == list(range(8))
    mem = res.frames["memory"].iloc[0]
    assert mem["allocated"] == pytest.approx(9554.87939453125 * MiB)


def test_figures_printed_with_their_running_mean():
    """`elapsed time per iteration (ms): 4480.6/6816.5`: this interval's figure, then the mean so far."""
    st = _steps(_load("megatron_primus_running_means.log"))
    assert list(st["iter_ms"]) == [9152.4, 4480.6, 4471.2]
    assert list(st["tflops"]) == [301.7, 616.3, 617.6]
    assert list(st["tokens_per_sec_per_gpu"]) == [7161.1, 14627.9, 14658.6]
    assert list(st["loss"]) == [11.88201, 11.60393, 11.2137] and st.loc[3, "grad_norm"] == 12.431


def test_nemo_progress_bar():
    res = _load("nemo_llama_sft.log")
    st = _steps(res)
    assert list(st.index) == [0, 1, 2, 49]  # NeMo's global_step as printed
    assert list(st["iter_ms"]) == [3370.0, 3120.0, 3130.0, 3110.0] and st.loc[49, "eval_loss"] == 0.874
    assert st.loc[2, "consumed_samples"] == 384.0 and st.loc[1, "loss"] == 2.244
    assert _layout(res) == {"tp": 2, "pp": 1, "dp": 4, "world_size": 8}


def test_megatron_2021_memory_line_without_rank_or_parentheses():
    """`after 5 iterations memory (MB) | ...` (Megatron-LM 2020-21, NVIDIA/Megatron-LM#60's log) was
    not read: only `[Rank 0] (after 5 iterations) memory (MB)` was. The fp16 calibration before it
    (every iteration of the first 15 skipped) is no finding (test_logs_rules)."""
    res = _load("megatron_lm_2021_fp16_calibration.log")
    mem = res.frames["memory"]
    assert len(mem) == 1 and mem.iloc[0]["step"] == 5
    assert mem.iloc[0]["allocated"] == pytest.approx(9821.2548828125 * MiB)
    assert mem.iloc[0]["peak"] == pytest.approx(11933.7119140625 * MiB)
    assert mem.iloc[0]["reserved"] == pytest.approx(16804.0 * MiB)
    st = _steps(res)
    assert list(st.index) == [5, 10, 15, 20, 25, 30] and st.loc[20, "loss"] == pytest.approx(10.95114)


def test_deepspeed_0_5_timer_line_samples_per_sec():
    """DeepSpeed 0.3-0.6 print `0/40, SamplesPerSec=83.5, MemAllocated=0.26GB, MaxMemAllocated=9.02GB`
    (DeepSpeed#1825's, #849's logs; 0.3 without the memory): neither throughput nor memory was read."""
    res = _load("ds_0_5_samples_per_sec.log")
    st = _steps(res)
    assert list(st.index) == [10, 20, 30, 40] and st.loc[30, "samples_per_sec"] == pytest.approx(
        51.51904318722645
    )
    assert st.loc[20, "iter_ms"] == pytest.approx((19.655 - 3.412) / 10 * 1e3)
    mem = res.frames["memory"].set_index("step")
    assert mem.loc[40, "allocated"] == pytest.approx(1.87 * GiB) and mem.loc[40, "peak"] == pytest.approx(
        6.43 * GiB
    )
    ov = res.frames["overflow"]
    assert list(ov["step"]) == [11] and list(ov["scale_after"]) == [32768]


def test_deepspeed_0_3_timer_line_without_memory(tmp_path):
    path = tmp_path / "ds.log"
    path.write_text(
        "[2021-01-19 16:40:08,337] [INFO] [timer.py:154:stop] 0/50, SamplesPerSec=48.97215470127398\n"
    )
    st = _steps(import_log(str(path)))
    assert list(st.index) == [50] and st.loc[50, "samples_per_sec"] == pytest.approx(48.97215470127398)


def test_gpt_neox_iteration_and_validation_lines():
    """GPT-NeoX's iteration line: `samples/sec` in front, `approx flops per GPU: 112.4TFLOPS` with its
    own unit, `lm_loss` (DeepSpeed#3742's log: no loss, no TFLOP/s were read), and its validation line."""
    st = _steps(_load("gpt_neox_iterations.log"))
    assert list(st.index) == [10, 20, 30] and list(st["loss"]) == [10.87123, 9.915543, 9.201187]
    assert list(st["tflops"]) == pytest.approx([112.4, 112.2, 0.9876])  # 987.6GFLOPS
    assert list(st["samples_per_sec"]) == [7.764, 7.75, 7.73] and st.loc[20, "iter_ms"] == 4129.1
    assert st.loc[30, "eval_loss"] == pytest.approx(9.187345) and st.loc[30, "eval_ppl"] == pytest.approx(
        9776.014
    )


def test_gpt_neox_arguments_dump_and_its_oom_fix():
    """GPT-NeoX's dump (`model_parallel_size .... 1......updated`, VHellendoorn/Code-LMs#21's log) gave no
    layout, was taken for Megatron's (a Megatron-LM job: `--micro-batch-size` fixes), and its OOM got
    Megatron-LM flags NeoX has not: the layout is read, the arguments are not Megatron's, the fix is in
    NeoX's config keys."""
    res = _load("gpt_neox_oom_at_start.log")
    assert _layout(res) == {
        "world_size": 4,
        "tp": 1,
        "pp": 1,
        "zero_stage": 1,
        "dtype": "fp16",
        "micro_batch": 8,
        "global_batch": 32,
        "grad_accum": 1,
    }
    head = res.headers[0]
    assert "megatron_args" not in head and head["model"]["num_layers"] == 24
    assert "neox" in head["log_families"]
    fail = res.frames["log_failure"]
    fix = fail.loc[fail["first"], "fix"].iloc[0]
    assert "train_micro_batch_size_per_gpu" in fix and "--" not in fix


def test_an_oom_of_no_known_framework_names_no_knob(tmp_path):
    path = tmp_path / "oom.log"
    path.write_text(
        'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
        " of 79.15 GiB of which 1.05 GiB is free.\n"
    )
    fail = import_log(str(path)).frames["log_failure"]
    fix = fail.loc[fail["first"], "fix"].iloc[0]
    assert fix.startswith("lower the per-GPU batch size") and "_" not in fix and "--" not in fix


def test_nemo2_progress_printer():
    """NeMo 2's ProgressPrinter (bionemo-recipes#740's log): `iteration` restarts each epoch, `global_step`
    is the step; its `key: value` fields were read as a Megatron iteration line with none of its keys
    (steps numbered per epoch, no loss, no time)."""
    st = _steps(_load("nemo2_progress_printer.log"))
    assert list(st.index) == [9, 19, 29, 39, 49]
    assert list(st["iter_ms"]) == [2417.0, 2391.0, 2402.0, 2398.0, 2409.0]
    assert list(st["loss"]) == [1.872, 1.514, 1.388, 1.297, 1.251] and st.loc[39, "lr"] == 1e-05
    assert st.loc[49, "consumed_samples"] == 1600 and set(st["global_batch"]) == {32}
    assert st["eval_loss"].isna()[:2].all() and st.loc[29, "eval_loss"] == 1.406


# -- HF Trainer -----------------------------------------------------------------------------------


def test_hf_trainer_dicts_bar_and_summary():
    res = _load("hf_trainer_zero3_bf16.log")
    st = _steps(res)
    # every count the training bar shows is a step (the eval bar's are not); the dicts sit at its count
    assert list(st.index) == list(range(1, 21))
    # `2.13s/it`, `2.16s/it`: a steady bar's averages, so each step's own time is about the same
    assert list(st.loc[[10, 20], "iter_ms"]) == [
        pytest.approx(2130.0, rel=0.02),
        pytest.approx(2160.0, rel=0.02),
    ]
    assert list(st["loss"].dropna()) == [1.3425, 1.107]  # numbers, and strings in recent releases
    assert list(st.index[st["loss"].notna()]) == [10, 20]
    assert st.loc[20, "grad_norm"] == 1.944 and st.loc[20, "eval_loss"] == 1.0812
    run = dict(zip(res.frames["log_run"]["key"], res.frames["log_run"]["value"]))
    assert run["train_runtime"] == 449.3 and run["train_samples_per_second"] == 2.849
    assert _layout(res) == {
        "world_size": 8,
        "zero_stage": 3,
        "dtype": "bf16",
        "micro_batch": 4,
        "global_batch": 64,
        "grad_accum": 2,
    }


def test_hf_bar_without_dicts_gives_steps(tmp_path):
    """BigScience's hf_ds_gpt2_base_n16 log (transformers 2021, `logging_steps` 500 > 4 steps) prints
    no dict: its training bar is its only step record, and its `Total optimization steps` line has
    the logging prefix `[INFO|trainer.py:1149] <time> >>`."""
    path = tmp_path / "x.log"
    path.write_text(
        "[INFO|trainer.py:1149] 2021-05-25 06:30:55,948 >>   Total optimization steps = 4\n"
        "  0%|          | 0/4 [00:00<?, ?it/s]\r 25%|██▌       | 1/4 [03:45<11:15, 225.28s/it]\r"
        " 50%|█████     | 2/4 [07:15<07:21, 220.73s/it]\r100%|██████████| 4/4 [14:31<00:00, "
        "219.64s/it]\n"
    )
    st = _steps(import_log(str(path)))
    assert list(st.index) == [1, 2, 4] and st.loc[1, "iter_ms"] == 225280.0  # the first: its rate
    # then each display's own step time (`tqdm_times`), near the steady averages printed
    assert list(st["iter_ms"][1:]) == [pytest.approx(220730.0, rel=0.03), pytest.approx(219640.0, rel=0.03)]


def test_hf_step_logs_with_the_runtime_so_far():
    """`include_num_input_tokens_seen` puts `train_runtime` (seconds so far) in every step's dict: each
    is a step (not the run summary), its time the runtime between two logs, not tqdm's moving average
    (13.22 s/it at step 2 still carries step 1's 27 s start-up)."""
    res = _load("hf_tokens_seen_runtime.log")
    st = _steps(res)
    assert list(st["loss"]) == [2.5586, 2.8427, 2.6978, 2.7241, 2.5838, 2.5221]
    assert st.loc[1, "iter_ms"] == 27200.0  # no log before it: the bar's rate
    assert [round(x) for x in st["iter_ms"][1:]] == [3530, 3550, 3540, 4200, 3530]
    run = res.frames["log_run"].set_index("key")["value"]
    assert run["train_runtime"] == 49.4295 and run["train_loss"] == 2.6549


def test_hf_rate_in_iterations_per_second(tmp_path):
    path = tmp_path / "x.log"
    path.write_text(
        " 5%|▌         | 10/200 [00:03<00:57,  3.20it/s]\r{'loss': 0.5, 'learning_rate': 1e-05, "
        "'epoch': 0.05}\n"
    )
    st = _steps(import_log(str(path)))
    assert st.loc[10, "iter_ms"] == pytest.approx(312.5)


# -- failures -------------------------------------------------------------------------------------


def _failure(res) -> JobFailed:
    (p,) = res.problems
    assert isinstance(p, JobFailed) and p.job_failed
    return p


def test_sixteen_ranks_raise_before_step_one():
    res = _load("crash_16ranks_before_step1.log")
    p = _failure(res)
    assert res.ranks == list(range(16)) and res.headers[11]["host"] == "worker-1"
    assert "job failed before step 1: RuntimeError on rank(s) 0-15 (first: rank 11, line 9)" in p.message
    assert "must match the size of tensor b" in p.message
    assert "launcher: rank(s) 0-15 ended with exit code 1" in p.message  # --local_rank mapped per host
    assert p.line == 9


def test_oom_after_step_three_names_rank_sizes_and_megatron_fix():
    p = _failure(_load("oom_megatron_after_step3.log"))
    assert p.message.startswith(
        "job failed after step 3 (the last completed): CUDA out of memory on rank(s) 2"
    )
    assert "tried to allocate 2.00 GiB on GPU 2 (1.05 GiB free of 79.15 GiB)" in p.message
    assert "--micro-batch-size" in p.message and "exit code 1" in p.message


def test_old_oom_wording_and_sigkill_in_hf_job():
    p = _failure(_load("hf_oom_sigkill.log"))
    assert "CUDA out of memory" in p.message
    assert "tried to allocate 1.53 GiB on GPU 0 (1.12 GiB free of 39.59 GiB)" in p.message
    assert "per_device_train_batch_size" in p.message
    assert "rank(s) 1 ended with exit code -9 (SIGKILL)" in p.message


def test_nccl_watchdog_timeouts_name_the_desynced_rank():
    p = _failure(_load("nccl_timeout_desync.log"))
    assert "after step 120" in p.message and "NCCL collective timeout on rank(s) 0-3" in p.message
    assert "ALLREDUCE SeqNum=48211 on rank(s) 0-1, 3 (timeout 600000 ms)" in p.message
    assert "desync: ALLGATHER SeqNum=48210 on rank(s) 2 differ" in p.message
    assert "exit code -6 (SIGABRT)" in p.message


def test_mpi_launch_world_size_and_a_rich_boxed_traceback():
    """An mpiexec launch (no DeepSpeed launcher: each rank prints `Discovered MPI settings ... world_size=4`)
    that dies in a `rich` boxed traceback before step 1, as ALCF's Megatron-DeepSpeed runs print."""
    res = _load("ds_mpi_rich_traceback.log")
    assert res.ranks == [0, 1, 2, 3] and _layout(res)["world_size"] == 4
    p = _failure(res)
    assert p.line == 17 and p.message.startswith("job failed before step 1: TypeError")
    assert "WarmupLR.step() got an unexpected keyword argument 'increment'" in p.message


def test_a_traceback_the_job_survived_is_not_a_crash():
    res = _load("caught_exception_then_trains.log")
    assert not res.problems and list(_steps(res).index) == [10, 20, 30]


def test_launcher_exit_code_alone_is_a_failure(tmp_path):
    path = tmp_path / "x.log"
    path.write_text(
        "[Rank 0] step=10, skipped=0, lr=[0.1]\n[2024-01-01 00:00:00,000] [ERROR] "
        "[launch.py:321:sigkill_handler] ['python', '-u', 'train.py', '--local_rank=3'] "
        "exits with return code = -9\n"
    )
    p = _failure(import_log(str(path)))
    assert p.message.startswith(
        "job failed after step 10 (the last completed): process ended with exit "
        "code -9 (SIGKILL) on rank(s) 3"
    )
    assert "OOM killer" in p.message


@pytest.mark.parametrize(
    "content,reason",
    [(b"\x00\x01\x02binary" * 50, "binary"), (b"hello\nworld\n", "no DeepSpeed/Megatron/HF")],
)
def test_not_a_log(tmp_path, content, reason):
    path = tmp_path / "x.log"
    path.write_bytes(content)
    with pytest.raises(ImportProblem, match=reason):
        import_log(str(path))


def test_unprefixed_overflow_lines_a_few_ms_apart_are_one_step(tmp_path):
    """Without a rank prefix or optimizer iteration, lines repeating the scales within 100 ms are the
    ranks printing one step; the same scales a step later (at the minimum scale) are another step."""
    line = (
        "[2024-03-08 16:33:21,{ms:03d}] [INFO] [stage3.py:2070:step] [deepspeed] fp16 dynamic loss "
        "scale overflow! Skipping step. Attempted loss scale: 1.0, reducing to 1.0\n"
    )
    path = tmp_path / "x.log"
    path.write_text("".join(line.format(ms=ms) for ms in (416, 416, 417, 417, 900, 901)))
    assert len(import_log(str(path)).frames["overflow"]) == 2


def test_hostile_counters_stay_bounded(tmp_path):
    """A counter claiming 259807 skipped steps over 31 M iterations (found by the fuzz test) adds at
    most MAX_ADDED rows, quickly, instead of enumerating 31 M steps; a count above its interval's
    length is capped at it."""
    from diag.importers.logs.overflow import MAX_ADDED

    ds, mg = tmp_path / "ds.log", tmp_path / "mg.log"
    ds.write_text("[Rank 0] step=30992406, skipped=259807, lr=[x]\n")
    mg.write_text(" iteration 5/ 9 | number of skipped iterations: 99999999 |\n")
    ov = import_log(str(ds)).frames["overflow"]
    assert len(ov) == MAX_ADDED and ov["step"].is_unique
    assert list(import_log(str(mg)).frames["overflow"]["step"]) == [1, 2, 3, 4, 5]


def test_failure_frame_for_rules():
    res = _load("nccl_timeout_desync.log")
    df = res.frames["log_failure"].sort_values(["kind", "rank"])
    assert list(zip(df["kind"], df["rank"], df["seq"].fillna(-1))) == [
        ("exit", 0, -1),
        ("nccl_timeout", 0, 48211),
        ("nccl_timeout", 1, 48211),
        ("nccl_timeout", 2, 48210),
        ("nccl_timeout", 3, 48211),
    ]
    assert set(df["step"]) == {120} and "log_failure" not in _load("caught_exception_then_trains.log").frames


def test_torchrun_report_of_killed_ranks():
    """No rank raised: torchrun's ChildFailedError report names the killed ranks (its own traceback
    around the report is not the job's exception)."""
    res = _load("torchrun_sigkill.log")
    p = _failure(res)
    assert p.message.startswith(
        "job failed after step 100 (the last completed): process ended with exit "
        "code -9 (SIGKILL) on rank(s) 1, 3"
    )
    assert "OOM killer" in p.message and res.headers[3]["host"] == "gpu-node-3"
    fails = res.frames["log_failure"]
    assert set(fails["kind"]) == {"exit"} and sorted(fails["rank"]) == [1, 3]  # the report's, not local_rank


def test_gzip_log_and_truncated_gzip(tmp_path):
    import gzip

    data = gzip.compress(open(os.path.join(FIX, "megatron_lm_fp16.log"), "rb").read())
    (tmp_path / "ok.log.gz").write_bytes(data)
    (tmp_path / "cut.log.gz").write_bytes(data[:300])
    assert list(_steps(import_log(str(tmp_path / "ok.log.gz"))).index) == [10, 20, 30]
    with pytest.raises(ImportProblem, match="truncated or corrupt gzip"):
        import_log(str(tmp_path / "cut.log.gz"))


@pytest.mark.parametrize(
    "first",
    [
        "{'loss': 2.1, 'learning_rate': 5e-05, 'epoch': 0.1}",
        "[rank0]: Traceback (most recent call last):",
        "[2024-01-01 00:00:00,000] [ERROR] [launch.py:321:sigkill_handler] "
        "['python', '--local_rank=0'] exits with return code = 1",
    ],
)
def test_small_logs_are_detected_as_logs(tmp_path, first):
    from diag.importers import detect

    path = tmp_path / "job.out"
    path.write_text(first + "\n")
    assert detect.kind_of_file(str(path)) == detect.LOG


def test_megatron_deepspeed_iteration_line_wins_over_deepspeeds_engine_line(tmp_path):
    """Under Megatron-DeepSpeed the engine prints `steps: N loss: .. iter time (s): ..` before
    Megatron's iteration line: the first line's figures were kept (92.0 ms median where Megatron
    says 99.85, a 4-decimal loss). The job's own iteration line states the step."""
    path = tmp_path / "job.log"
    path.write_text(
        "steps: 1 loss: 6.9237 iter time (s): 0.111 samples/sec: 18.013\n"
        " iteration        1/      40 | consumed samples:            2 | elapsed time per iteration (ms): "
        "113.4 | learning rate: 1.000E-03 | global batch size:     2 | lm loss: 6.923712E+00 | loss scale: "
        "1.0 | number of skipped iterations:   0 | number of nan iterations:   0 | "
        "samples per second: 17.640 | tokens per gpu per second (tgs): 564.494 |\n"
        "steps: 2 loss: 6.9204 iter time (s): 0.068 samples/sec: 29.480\n"  # no Megatron line for step 2
    )
    st = _steps(import_log(str(path)))
    assert st.loc[1, "iter_ms"] == 113.4 and st.loc[1, "loss"] == 6.923712
    assert st.loc[1, "samples_per_sec"] == 17.64
    assert st.loc[1, "tokens_per_sec_per_gpu"] == 564.494
    assert st.loc[2, "iter_ms"] == 68.0 and st.loc[2, "loss"] == 6.9204  # the engine's line alone


def test_hf_two_ranks_dicts_on_one_line_are_two_dicts_and_no_rank_is_zero_ranks():
    """A real HF Trainer + DeepSpeed ZeRO-2 job under torchrun (2 ranks on CPU, 12 steps, transformers
    5): both ranks print the bar and the dicts, and at step 5 they wrote theirs at once:
    `{'loss': '5.395', ...}{'loss': '5.395', ...}` on one line. That line was no dict: the log alone
    said 11 steps (no 5) where the job ran 12; and, naming no rank, `0 ranks`."""
    name = "hf_torchrun_two_ranks_print.log"
    st = _steps(_load(name))
    assert list(st.index) == list(range(1, 13))
    assert st.loc[5, "loss"] == 5.395 and st.loc[5, "grad_norm"] == 0.7538 and st.loc[5, "lr"] == 0.0008
    assert rank_count(_load(name).ranks) == "ranks not named"
