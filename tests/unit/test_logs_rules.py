"""Rules on what a training log states: loss spikes, nan/inf losses, throughput drops and regressions,
and the crash of the job as a finding.

The loss and throughput fixtures (`megatron_loss_spike.log`, `megatron_throughput_regression.log`,
`ds_throughput_drop.log`, `hf_noisy_finetune.log`, `hf_nan_loss.log`) are written line for line in the
formats of the other fixtures (Megatron-LM's iteration line, DeepSpeed's `step=` and timer lines, the
HF Trainer's progress bar and log dicts) with seeded figures; the crash fixtures are issue 18's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from diag.analyzers import run_all

from diag.importers import load_inputs
from tests.unit.kineto_samples import ROOT

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logs")
LOG_RULES = ("job_crash", "loss_spike", "nan_loss", "throughput_drop")


def _findings(*names: str, path: str | None = None) -> list:
    trace = load_inputs([path] if path else [os.path.join(FIX, n) for n in names])
    found, failures = run_all(trace)
    assert failures == {}
    return found


def _one(rule: str, name: str, path: str | None = None):
    found = [f for f in _findings(name, path=path) if f.rule == rule]
    assert len(found) == 1, [f.title for f in _findings(name, path=path)]
    return found[0]


HEALTHY = [
    "caught_exception_then_trains.log",
    "ds_pipeline.log",
    "ds_zero2_fp16.log",
    "hf_trainer_zero3_bf16.log",
    "megatron_deepspeed_tp2_pp2.log",
    "megatron_lm_fp16.log",
    "nemo_llama_sft.log",
    "hf_noisy_finetune.log",
    # bf16 Megatron (`loss scale: 1.0` on every line) skipping one NaN-gradient iteration: read as
    # "fp16 loss scale collapsed to 1" (epfLLM/Megatron-LLM#34's log), a scale that never moved
    "megatron_bf16_grad_nan_skip.log",
    "nemo2_progress_printer.log",
    "torchtitan_llama3_fsdp.log",
    "megatron_lm_2021_fp16_calibration.log",
    "ds_0_5_samples_per_sec.log",
    "gpt_neox_iterations.log",
]


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_logs_are_silent(name):
    assert [f.title for f in _findings(name)] == []


def test_the_spike_and_the_drop_fixtures_are_healthy_in_their_other_figures():
    assert [f.rule for f in _findings("megatron_loss_spike.log")] == ["loss_spike"]
    assert [f.rule for f in _findings("ds_throughput_drop.log")] == ["throughput_drop"]
    assert [f.rule for f in _findings("hf_nan_loss.log")] == ["nan_loss"]


# -- loss ---------------------------------------------------------------------------------------


def test_loss_spike_names_the_steps_the_baseline_and_recovery():
    f = _one("loss_spike", "megatron_loss_spike.log")
    assert f.steps == [310, 320] and f.severity == "warning"
    first = f.evidence["spikes"][0]
    assert first["step"] == 310 and first["loss"] == pytest.approx(7.955849)
    # the baseline is the median of the 5 logged losses before (iterations 260-300)
    assert first["baseline"] == pytest.approx(3.788540)
    assert f.evidence["recovered"] is True and f.evidence["last_loss"] < first["baseline"]


def test_a_spike_the_run_never_recovers_from_is_critical(tmp_path):
    text = open(os.path.join(FIX, "megatron_loss_spike.log")).read().splitlines()
    # from iteration 310 on every loss is the spike's: the run diverged
    out = [
        ln.replace(ln.split("lm loss: ")[1].split(" |")[0], "7.955849E+00")
        if "lm loss: " in ln and int(ln.split("iteration")[1].split("/")[0]) >= 310
        else ln
        for ln in text
    ]
    path = tmp_path / "diverged.log"
    path.write_text("\n".join(out) + "\n")
    f = _one("loss_spike", "", path=str(path))
    assert f.severity == "critical" and f.evidence["recovered"] is False and f.steps[0] == 310


def test_hf_prints_a_nan_loss_as_a_bare_nan_and_it_is_read():
    log = load_inputs([os.path.join(FIX, "hf_nan_loss.log")]).frame("log_step").set_index("step")
    assert bool(log.loc[120, "loss_nonfinite"]) and log.loc[110, "loss"] == 0.9414
    f = _one("nan_loss", "hf_nan_loss.log")
    assert f.severity == "critical" and f.steps[:3] == [120, 130, 140] and f.evidence["nonfinite_steps"] == 9
    assert f.evidence["last_finite"]["step"] == 110


def test_megatron_nan_iteration_counter(tmp_path):
    text = open(os.path.join(FIX, "megatron_lm_fp16.log")).read()
    path = tmp_path / "nan.log"
    path.write_text(
        text.replace(
            "number of nan iterations:   0 |\n [2025-10-06 03:27:54]",
            "number of nan iterations:   2 |\n [2025-10-06 03:27:54]",
        )
    )
    f = _one("nan_loss", "", path=str(path))
    assert f.steps == [20] and f.evidence["nan_iterations"] == 2 and f.evidence["nonfinite_steps"] == 0


def test_megatron_leaves_a_nan_loss_out_of_its_line():
    """Megatron prints a loss only where its interval mean is > 0: epfLLM/Megatron-LLM#33's bf16 run
    went on with lines without `lm loss` (grad norm nan, nothing skipped) and diag saw nothing. A line
    without the loss the earlier ones printed, whose interval applied an iteration, is a nan loss; the
    fp16 calibration (every iteration skipped, no loss printed) and a skipped nan-gradient iteration
    stay silent (HEALTHY)."""
    f = _one("nan_loss", "megatron_bf16_nan_loss_left_out.log")
    assert f.steps == [2104, 2105, 2106] and f.evidence["nonfinite_steps"] == 3
    assert f.evidence["last_finite"] == {"step": 2103, "loss": pytest.approx(0.6902)}
    assert "left out by Megatron" in f.detail


def test_a_stage_without_the_loss_is_no_nan_loss(tmp_path):
    """Pipeline stages before the last have no loss: where they print the iteration line too (here
    first), the last stage's line of the same iteration has it."""
    line = (
        "[rank{r}]: iteration {it:8d}/     100 | elapsed time per iteration (ms): 812.3 |{loss} loss scale:"
        " 1.0 | grad norm: 3.300 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    path = tmp_path / "pp.log"
    path.write_text(
        "\n".join(
            line.format(r=r, it=it, loss=" lm loss: 7.1E+00 |" if r == 3 else "")
            for it in (10, 20, 30)
            for r in (0, 3)
        )
    )
    assert [f for f in _findings(path=str(path)) if f.rule == "nan_loss"] == []


def test_a_missing_loss_is_not_a_nan_loss():
    """DeepSpeed's `step=` lines print no loss: NaN in the frame, but not a nan loss."""
    assert [f for f in _findings("ds_zero2_fp16.log") if f.rule == "nan_loss"] == []


# -- throughput ---------------------------------------------------------------------------------


def test_throughput_drop_from_timestamps():
    f = _one("throughput_drop", "ds_throughput_drop.log")
    assert f.steps == [150, 160, 170, 180] and f.evidence["figure"] == "iter_ms"
    assert f.evidence["worst_ratio"] == pytest.approx(2.0, abs=0.1)
    # per step of the run, as every rule's: 4 records ~1600 ms against a median of ~800 ms, 3.18 s
    # over 28 logged records (it was the slow records' own excess, 0.8 s "per step")
    assert f.recoverable_s == pytest.approx(f.evidence["time_lost_s"] / 28) == pytest.approx(0.114, abs=0.002)


def test_throughput_regression_over_the_run():
    f = _one("throughput_drop", "megatron_throughput_regression.log")
    assert "regressed" in f.title and f.evidence["ratio"] >= 1.25
    # 4700 + 5 ms per iteration: first third ~ iterations 20-140, last third ~ 280-400
    assert f.evidence["early_median"] == pytest.approx(5100, rel=0.03)
    assert f.evidence["late_median"] == pytest.approx(6400, rel=0.03)


def test_too_few_records_are_not_judged():
    """megatron_lm_fp16.log has 3 records; 4891 -> 4647 ms would be no drop anyway, but a run of 3 with
    a slow last record must not fire either."""
    assert _findings("ds_pipeline.log") == []


# -- the crash as a finding ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kind,rank,iteration,line,codes",
    [
        ("oom_megatron_after_step3.log", "oom", 2, 4, 19, {2: 1}),
        ("torchrun_sigkill.log", "exit", 1, 101, 29, {3: -9, 1: -9}),  # torchrun's root cause
        ("crash_16ranks_before_step1.log", "exception", 11, 1, 9, {r: 1 for r in range(16)}),
        ("nccl_timeout_desync.log", "nccl_timeout", 0, 121, 2, {0: -6}),
        ("hf_oom_sigkill.log", "oom", -1, 2, 12, {1: -9}),
        # one process, its traceback unprefixed: the OOM is rank 0's and leads, not torchrun's
        # "exit code 1" with "rank(s) ? raised" after it (jindajia/Megatron-LM debug/terminal.txt)
        ("oom_single_gpu_unprefixed.log", "oom", 0, 1, 16, {0: 1}),
    ],
)
def test_job_crash_finding(name, kind, rank, iteration, line, codes):
    f = _one("job_crash", name)
    ev = f.evidence
    assert f.severity == "critical" and (ev["kind"], ev["first_rank"], ev["failed_iteration"]) == (
        kind,
        rank,
        iteration,
    )
    assert ev["line"] == line and ev["exit_codes"] == codes and ev["path"].endswith(name)
    raw = open(os.path.join(FIX, name)).read().splitlines()[line - 1]
    assert ev["log_line"] == raw[:300]
    assert f.steps == [iteration] and f.detail.startswith("job failed")


def test_job_crash_keeps_nccl_seq_and_the_oom_fix():
    f = _one("job_crash", "nccl_timeout_desync.log")
    assert (f.evidence["seq"], f.evidence["op"]) == (48211, "ALLREDUCE")
    assert f.fixes[-1].summary.startswith("look at the rank(s) on another sequence number")
    oom = _one("job_crash", "oom_megatron_after_step3.log")
    assert "--micro-batch-size" in oom.fixes[0].summary
    assert _one("job_crash", "torchrun_sigkill.log").evidence["signal"] == "SIGKILL"


def test_a_timeout_every_reporting_rank_shares_points_at_the_silent_ranks(tmp_path):
    """LlamaFactory#7396: every rank that reported timed out on SeqNum 1580: no rank is on "another
    sequence number", the one holding them is among those that reported nothing."""
    line = (
        "[rank{r}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective"
        " operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168,"
        " NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
    )
    path = tmp_path / "t.log"
    path.write_text("\n".join(line.format(r=r) for r in (0, 4, 2)) + "\n")
    f = _one("job_crash", "", path=str(path))
    assert f.fixes[-1].summary.startswith("look at the ranks that reported no timeout")


def test_a_survived_traceback_is_no_crash():
    assert [f for f in _findings("caught_exception_then_trains.log") if f.rule == "job_crash"] == []


def test_cli_reports_the_crash_finding_and_still_exits_1():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    r = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", os.path.join(FIX, "torchrun_sigkill.log"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["rule"] == "job_crash"]
    assert f["evidence"]["exit_codes"] == {"3": -9, "1": -9} and f["ranks"] == [1, 3]


def test_pipeline_layer_list_numbers_are_not_ranks(tmp_path):
    """Found on BigScience's meg_ds_3d_gpt2_perf_n16-ds-on.out: PipelineModule's partition listing
    (`    70: float16_to_fp32`) read as srun labels gave 71 ranks for a 64-rank job."""
    from diag.importers.logs import import_log

    path = tmp_path / "pp.log"
    path.write_text(
        "using world size: 4, data-parallel-size: 1, tensor-model-parallel size: 2, "
        "pipeline-model-parallel size: 2\nstage=0 layers=7\n     0: _to_float16\n"
        "     1: EmbeddingPipe\n    69: EmbeddingPipe\n    70: float16_to_fp32\n"
    )
    assert import_log(str(path)).ranks == [0, 1, 2, 3]


def test_torchrun_root_cause_leads_and_an_unread_log_claims_no_step():
    """A public DDP program (pytorch/examples' multigpu_torchrun.py) whose rank 1 was SIGKILLed:
    rank 0 raised 'Connection reset by peer' first, a consequence; torchrun's report names rank 1 as
    the root cause. Its progress lines are its own: diag cannot say the job died before step 1."""
    f = _one("job_crash", "torchrun_peer_killed_no_progress.log")
    assert f.evidence["first_rank"] == 1 and f.evidence["signal"] == "SIGKILL"
    assert "before its first step" not in f.title and "no progress line" in f.title
    # nor does it name a step (it said steps [1], iteration 1: F5-TTS#346's NCCL timeout log too)
    assert f.steps == [] and f.evidence["failed_iteration"] is None
    assert "root cause" in f.detail and "then rank(s) 0 raised RuntimeError" in f.detail


def test_a_job_stopped_from_outside_is_no_crash():
    """scancel / a time limit / SIGTERM to torchrun: its SignalException is the only sign. The job
    did not fail by itself: an info finding, and no failed-job problem (exit 0), where it read as a
    CRITICAL crash (a public FSDP2 example stopped after a healthy window)."""
    f = _one("job_crash", "torchrun_stopped_sigterm.log")
    assert f.severity == "info" and "stopped from outside after iteration 20" in f.title
    res = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", os.path.join(FIX, "torchrun_stopped_sigterm.log"), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "job failed" not in res.stderr, res.stderr


def _megatron_ds_iterations(skipped: set[int], n: int = 40) -> str:
    """Megatron-DeepSpeed's iteration lines (its cumulative-free 'number of skipped iterations' per
    logged interval of 1), the loss scale halving at each skipped iteration."""
    lines, scale = [], 2.0**20
    for it in range(1, n + 1):
        skip = it in skipped
        scale = scale / 2 if skip else scale
        lines.append(
            f" iteration {it:8d}/{n:8d} | consumed samples: {2 * it:12d} | elapsed time per iteration (ms): "
            f"{100.0 + it % 3:.1f} | learning rate: 1.000E-03 | global batch size:     2 | "
            + ("" if skip else f"lm loss: {7.0 - it * 0.01:.6E} | ")
            + f"loss scale: {scale:.1f} | number of skipped iterations: {int(skip):3d} | "
            "number of nan iterations:   0 |"
        )
    return "\n".join(lines) + "\n"


def test_overflow_storm_from_a_log_alone_counts_its_timed_iterations(tmp_path) -> None:
    """The trial's Megatron-DeepSpeed fp16 job skipped iterations 1-3 (calibration), 15, 16, 38 and
    39 of 40. Its trace said 'overflow storm: 11% of steps skipped after calibration'; its log alone
    said nothing: a log's overflow rows are its skipped iterations only, so every one of them looked
    like calibration. The timed iterations are the steps that were not skipped."""
    log = tmp_path / "job.log"
    log.write_text(_megatron_ds_iterations({1, 2, 3, 15, 16, 38, 39}))
    f = _one("overflow_storm", "", path=str(log))
    assert f.evidence["overflow_steps"] == 4 and f.evidence["steps"] == 37
    healthy = tmp_path / "calibration.log"
    healthy.write_text(_megatron_ds_iterations({1, 2, 3}))
    assert [g for g in _findings(path=str(healthy)) if g.rule == "overflow_storm"] == []


def _hf_dicts(norms: list[str], losses: list[str] | None = None) -> str:
    """An HF Trainer log (transformers 5: values as strings, `logging_steps` 1): per step its bar
    count and its log dict with the grad norm given (`inf` where DeepSpeed skipped the step)."""
    n = len(norms)
    losses = losses or [f"{5.4 - i * 0.01:.4g}" for i in range(n)]
    return "".join(
        f" 50%|#####     | {i + 1}/{n} [00:0{i % 10}<00:01,  3.6{i % 10}it/s]"
        f"{{'loss': '{loss}', 'grad_norm': '{norm}', 'learning_rate': '0.001', 'epoch': '{i / 32:.4g}'}}\n"
        for i, (norm, loss) in enumerate(zip(norms, losses))
    )


def test_hf_skipped_steps_are_its_inf_grad_norms():
    """A real HF Trainer + DeepSpeed ZeRO-2 fp16 job (2 ranks on CPU, initial_scale_power 30, 16
    steps): its trace recorded 12 skipped steps (1-12, the scale halving from 2^30 to 2^19); its log
    alone said '0 overflows' and every step applied. The log's only sign is the Trainer's
    `'grad_norm': 'inf'` on those steps (DeepSpeed sets the norm to inf when it skips)."""
    name = "hf_ds_fp16_scale_calibration.log"
    trace = load_inputs([os.path.join(FIX, name)])
    of = trace.overflow
    assert sorted(of["step"].unique()) == list(range(1, 13))
    assert set(of["source"]) == {"log_grad_norm"}
    assert [f.rule for f in _findings(name)] == []  # a calibration from 2^30: no storm


def test_hf_inf_grad_norms_after_calibration_are_a_storm(tmp_path) -> None:
    norms = ["inf", "inf"] + ["0.8"] * 30
    for s in (10, 14, 18, 22, 26):
        norms[s - 1] = "inf"
    log = tmp_path / "job.log"
    log.write_text(_hf_dicts(norms))
    f = _one("overflow_storm", "", path=str(log))
    assert f.evidence["overflow_steps"] == 5 and f.evidence["steps"] == 30
    assert list(f.steps)[:5] == [10, 14, 18, 22, 26]


def test_an_inf_grad_norm_that_was_applied_or_is_the_last_is_no_skip(tmp_path) -> None:
    """An applied update with an inf norm leaves the weights non-finite: every later loss is nan (a
    divergence, `nan_loss`'s), not a skipped step. The last logged norm has no later loss to tell."""
    log = tmp_path / "job.log"
    log.write_text(_hf_dicts(["0.8"] * 11 + ["inf", "nan", "nan"], ["5.3"] * 12 + ["nan", "nan"]))
    trace = load_inputs([str(log)])
    assert trace.overflow.empty
    assert [f.rule for f in _findings(path=str(log))] == ["nan_loss"]
    last = tmp_path / "last.log"
    last.write_text(_hf_dicts(["0.8"] * 11 + ["inf"]))
    assert load_inputs([str(last)]).overflow.empty


def test_throughput_fixes_name_fragmentation_only_for_a_regression_and_cuda_only_off_cpu():
    """The trial's HF Trainer job on CPU (400 steps on a shared 2-core host) logged three slow
    stretches: a drop, not a slowdown that grows; its finding still offered 'a slowdown that grows
    over the run ... PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True', a CUDA allocator setting
    that a CPU job does not read."""
    drop = _one("throughput_drop", "ds_throughput_drop.log")
    assert [f.env for f in drop.fixes] == [{}] and "grows" not in drop.fixes[0].summary
    growing = _one("throughput_drop", "megatron_throughput_regression.log")
    assert growing.fixes[-1].env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    # the same regressing log beside a CPU job's trace (the sample run's, device `cpu`)
    trace = load_inputs([os.path.join(ROOT, "sample_traces", "healthy")])
    assert set(trace.memory["device"]) == {"cpu"}
    trace.frames["log_step"] = load_inputs([os.path.join(FIX, "megatron_throughput_regression.log")]).frame(
        "log_step"
    )
    (cpu,) = [f for f in run_all(trace)[0] if f.rule == "throughput_drop" and "regressed" in f.title]
    assert "grows" in cpu.fixes[-1].summary and all(not f.env for f in cpu.fixes)


def test_an_hf_trainer_storms_fix_names_its_training_arguments(tmp_path) -> None:
    """Under the HF Trainer the ds_config patch alone is refused: the Trainer fills ds_config's
    precision from TrainingArguments and raises on a value that differs (transformers 5.25's
    `fill_match("fp16.enabled", args.fp16 ...)`). The bf16 fix names TrainingArguments too."""
    norms = ["inf", "inf"] + ["0.8"] * 30
    for s in (10, 14, 18, 22, 26):
        norms[s - 1] = "inf"
    log = tmp_path / "job.log"
    log.write_text(
        "[2026-12-05 13:21:19,550] [INFO] [launch.py:170:main] dist_world_size=2\n" + _hf_dicts(norms)
    )
    f = _one("overflow_storm", "", path=str(log))
    bf16 = f.fixes[0]
    assert "TrainingArguments(bf16=True, fp16=False)" in bf16.summary
    assert bf16.ds_config == {"fp16": {"enabled": False}, "bf16": {"enabled": True}}
    assert all("TrainingArguments" not in x.summary for x in f.fixes if "gently" in x.summary)
