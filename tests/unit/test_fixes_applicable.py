"""Issue 11: every fix is applicable as written in the job's own framework and changes its setting.

Each planted problem is run under several framework headers (Megatron-DeepSpeed, Megatron-LM, plain
DeepSpeed, torchrec, nothing known); every Megatron argument a fix names must exist in that
framework's parser (analyzers/knob_table.py, generated from the real parsers) and every ds_config
patch must validate with the installed DeepSpeed's own config classes.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from diag.analyzers import framework, knob_table, run_all

from diag import schema
from tests.unit.synth_trace import MS, Job, fired

ROOT = Path(__file__).resolve().parents[2]
MDS_ARGV = [
    "pretrain_gpt.py",
    "--tensor-model-parallel-size",
    "1",
    "--pipeline-model-parallel-size",
    "2",
    "--num-layers",
    "2",
    "--micro-batch-size",
    "4",
    "--deepspeed",
    "--deepspeed_config",
    "ds.json",
]
MLM_ARGV = [
    "pretrain_gpt.py",
    "--pipeline-model-parallel-size",
    "2",
    "--num-layers",
    "8",
    "--micro-batch-size",
    "4",
    "--use-distributed-optimizer",
]
DS_CFG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 1},
    "fp16": {"enabled": True, "initial_scale_power": 8},
}
HEADERS = {
    "megatron-deepspeed": {
        "argv": MDS_ARGV,
        "zero_stage": 1,
        "dtype": "fp16",
        "ds_config": DS_CFG,
        "deepspeed": "0.15.0",
    },
    "megatron-lm": {"argv": MLM_ARGV, "dtype": "fp16", "megatron": "0.12.0"},
    "deepspeed": {
        "argv": ["train.py"],
        "zero_stage": 1,
        "dtype": "fp16",
        "ds_config": DS_CFG,
        "deepspeed": "0.19.8",
    },
    "unknown": {"argv": ["train.py"]},
}


def _planted(header: dict[str, Any]) -> list[Job]:
    """One job per rule pattern (comm-heavy, tiny ops, idle, overflow, memory, pipeline)."""
    jobs = []
    exposed = Job(header=copy.deepcopy(header))
    exposed.each_step(lambda r, s: exposed.comm(r, s, at_ms=10, dur_ms=60, nbytes=64 << 20))
    jobs.append(exposed)
    tiny = Job(header=copy.deepcopy(header))
    tiny.each_step(lambda r, s: [tiny.comm(r, s, nbytes=4096, at_ms=10 + i, dur_ms=0.5) for i in range(40)])
    jobs.append(tiny)
    jobs.append(Job(gap_ms=40, header=copy.deepcopy(header)))
    over = Job(steps=12, header=copy.deepcopy(header))
    for r in range(over.ranks):
        scale = 2.0**16
        for s in range(12):
            hit = s in (0, 4, 6, 8, 10)
            before, scale = scale, scale / 2 if hit else scale
            over.add(
                r,
                schema.OVERFLOW,
                step=s,
                ts=over.start(r, s) + 90 * MS,
                overflow=hit,
                scale_before=before,
                scale_after=scale,
                skipped_steps=0,
                source="update_scale",
            )
    jobs.append(over)
    mem = Job(header=copy.deepcopy(header))
    mem.each_step(
        lambda r, s: mem.add(
            r,
            schema.MEMORY,
            step=s,
            ts=mem.start(r, s) + 99 * MS,
            device="cuda:0",
            allocated=int(75e9),
            reserved=int(78e9),
            peak=int(77e9),
            capacity=80e9,
            rss=1,
            module=None,
        )
    )
    jobs.append(mem)
    accum = (header.get("ds_config") or {}).get("gradient_accumulation_steps", 1)
    pipe = Job(header={**copy.deepcopy(header), "pp": 2, "gradient_accumulation_steps": accum})
    pipe.each_step(
        lambda r, s: pipe.comm(r, s, op="send" if r == 0 else "recv", at_ms=20, dur_ms=50, group_ranks=[0, 1])
    )
    jobs.append(pipe)
    return jobs


def _ds_known_top_keys() -> set[str]:
    import deepspeed.runtime.activation_checkpointing.config as act
    import deepspeed.runtime.config as cfg
    import deepspeed.runtime.zero.config as zero

    return {v for m in (cfg, act, zero) for k, v in vars(m).items() if k.isupper() and isinstance(v, str)}


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def validate_ds_patch(patch: dict[str, Any], base: dict[str, Any]) -> None:
    """The installed DeepSpeed's own classes accept the patched config (ZeRO and fp16/bf16 sections
    forbid unknown keys; unknown top-level keys are checked against its constants)."""
    pytest.importorskip("deepspeed", reason="the ds_config check needs DeepSpeed's config classes")
    from deepspeed.runtime.config import DeepSpeedConfig

    unknown = set(patch) - _ds_known_top_keys()
    assert not unknown, f"not DeepSpeed config keys: {unknown}"
    merged = _merge({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, **base}, patch)
    merged.pop("train_batch_size", None)
    DeepSpeedConfig(merged)


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_every_fix_exists_in_the_jobs_framework(tmp_path, name):
    seen = 0
    for i, job in enumerate(_planted(HEADERS[name])):
        trace = job.write(str(tmp_path / str(i)))
        detected = framework.detect(trace)
        assert detected.framework == name
        findings, failures = run_all(trace)
        assert failures == {}
        for f in findings:
            for fix in f.fixes:
                seen += 1
                for a in fix.megatron_args:
                    if a.startswith("--"):
                        assert a in knob_table.ARGS[name], f"{f.rule}: {a} is no {name} argument"
                assert detected.applicable(fix), f"{f.rule}: {fix} names a knob of another release"
                if fix.ds_config is not None:
                    assert detected.deepspeed is not False, f"{f.rule}: ds_config for a {name} job"
                    validate_ds_patch(fix.ds_config, detected.ds_config)
                    assert "if the job uses DeepSpeed" in fix.summary or detected.deepspeed
    assert seen > 0  # the planted problems were found


def test_no_fix_repeats_the_current_setting(tmp_path):
    """The job runs initial_scale_power 8, 4 microbatches over 2 stages, overlap_comm on, default
    buckets: no fix may propose any of these values again (issue 11)."""
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4,
        "zero_optimization": {"stage": 1, "overlap_comm": True},
        "fp16": {"enabled": True, "initial_scale_power": 8},
    }
    header = {"zero_stage": 1, "dtype": "fp16", "ds_config": cfg, "deepspeed": "0.19.8"}
    for i, job in enumerate(_planted(header)):
        findings, _ = run_all(job.write(str(tmp_path / str(i))))
        for f in findings:
            for fix in f.fixes:
                patch = fix.ds_config or {}
                assert patch.get("gradient_accumulation_steps") != 4, f.rule
                assert (patch.get("fp16") or {}).get("initial_scale_power") != 8, f.rule
                zero = patch.get("zero_optimization") or {}
                assert zero.get("overlap_comm") is not True, f.rule
                assert zero.get("reduce_bucket_size") != int(5e8), f.rule


def test_suggested_literal_flags_exist_somewhere():
    """Every `--flag` literal in the rules is an argument of Megatron-DeepSpeed or Megatron-LM (a typo
    or a removed flag fails here, whatever framework the tests above exercised)."""
    every = knob_table.ARGS["megatron-deepspeed"] | knob_table.ARGS["megatron-lm"]
    flags = set()
    for path in (ROOT / "analyzers").glob("*.py"):
        if path.name in ("knob_table.py", "framework.py"):  # the table; detection signs
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("--")
                and " " not in node.value
            ):
                flags.add(node.value)
    assert flags and flags <= every, sorted(flags - every)


def test_knob_table_records_its_source():
    for name in ("megatron-deepspeed", "megatron-lm"):
        src = knob_table.SOURCES[name]
        assert len(src["commit"]) == 40 and src["repo"].count("/") == 1
        assert len(knob_table.ARGS[name]) > 200
    # the flags issue 11 found suggested to Megatron-DeepSpeed jobs are Megatron-LM's only
    for flag in (
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--ddp-bucket-size",
        "--decoder-first-pipeline-num-layers",
    ):
        assert flag in knob_table.ARGS["megatron-lm"] and flag not in knob_table.ARGS["megatron-deepspeed"]


def test_zero_keys_match_the_installed_deepspeed():
    ds = pytest.importorskip("deepspeed", reason="compares with the installed DeepSpeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    if ds.__version__ != knob_table.DEEPSPEED_VERSION:
        pytest.skip(f"table made with DeepSpeed {knob_table.DEEPSPEED_VERSION}, {ds.__version__} installed")
    assert set(DeepSpeedZeroConfig.model_fields) <= knob_table.ZERO_KEYS


# -- detection ---------------------------------------------------------------------------------


def test_detect_from_logs():
    from diag.importers import load_inputs

    logs = ROOT / "tests" / "fixtures" / "logs"
    mds = framework.detect(load_inputs([str(logs / "megatron_deepspeed_tp2_pp2.log")]))
    assert mds.framework == framework.MEGATRON_DEEPSPEED and mds.arg("pipeline_model_parallel_size") == 2
    mlm = framework.detect(load_inputs([str(logs / "megatron_lm_fp16.log")]))
    assert mlm.framework == framework.MEGATRON_LM
    ds = framework.detect(load_inputs([str(logs / "ds_zero2_fp16.log")]))
    assert ds.framework == framework.DEEPSPEED and ds.ds_config["fp16"]["hysteresis"] == 2


def test_detect_from_header_and_kineto_ops(tmp_path):
    mlm = Job(header={"argv": MLM_ARGV, "megatron": "0.12.0"}).write(str(tmp_path / "mlm"))
    job = framework.detect(mlm)
    assert (job.framework, job.version, job.arg("--num-layers")) == (framework.MEGATRON_LM, "0.12.0", 8)
    trace = Job(header={}).write(str(tmp_path / "rec"))
    assert framework.detect(trace).framework == framework.UNKNOWN
    trace.frames["cpu_op"] = pd.DataFrame({"rank": [0, 0], "name": ["aten::mm", "## sdd_forward ##"]})
    assert framework.detect(trace).framework == framework.TORCHREC
    trace.frames["cpu_op"] = pd.DataFrame({"rank": [0], "name": ["FullyShardedDataParallel.forward"]})
    assert framework.detect(trace).framework == framework.FSDP


# -- the false alarms and wrong fixes issue 11 lists -------------------------------------------


def test_torchrec_gets_no_deepspeed_overlap_comm(tmp_path):
    job = Job(header={})
    job.each_step(lambda r, s: job.comm(r, s, at_ms=10, dur_ms=60, nbytes=64 << 20, op="all_to_all"))
    trace = job.write(str(tmp_path))
    trace.frames["cpu_op"] = pd.DataFrame({"rank": [0], "name": ["torchrec::KJTAllToAll"]})
    (f,) = fired(trace, "exposed_comm")
    assert f.fixes == []
    # nothing known: the DeepSpeed fix is conditional, not an assertion that overlap_comm is off
    (f,) = fired(job.write(str(tmp_path / "unknown")), "exposed_comm")
    assert "(overlap_comm is off" not in f.fixes[0].summary and "if overlap_comm is off" in f.fixes[0].summary


def test_megatron_deepspeed_pipeline_bubble_names_no_megatron_lm_flags(tmp_path):
    header = {**HEADERS["megatron-deepspeed"], "pp": 2, "gradient_accumulation_steps": 1}
    job = Job(header=header)
    job.each_step(
        lambda r, s: job.comm(r, s, op="send" if r == 0 else "recv", at_ms=20, dur_ms=50, group_ranks=[0, 1])
    )
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    assert all(x.megatron_args == [] for x in f.fixes)
    assert [x.ds_config for x in f.fixes] == [{"gradient_accumulation_steps": 4}]


def test_megatron_deepspeed_pipeline_engine_gets_no_partition_method_fix(tmp_path):
    """Megatron-DeepSpeed's GPTModelPipe runs DeepSpeed's engine with partition_method hard-coded to
    'type:transformer' (no argument), 4 micro-batches over 2 stages (its pretrain_gpt.py at TP=2 x
    PP=2, measured: bubble 0.30 of compute): nothing the job can set is left to name."""
    header = {**HEADERS["megatron-deepspeed"], "pp": 2, "pipeline_engine": "deepspeed"}
    job = Job(header={**header, "gradient_accumulation_steps": 4})

    def step(r: int, s: int) -> None:
        for i in range(4):
            job.comm(r, s, op="send", nbytes=4096, at_ms=5 * i, dur_ms=1, group_ranks=[0, 1])
        job.comm(r, s, op="recv", at_ms=30, dur_ms=30, group_ranks=[0, 1])

    job.each_step(step)
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    assert f.evidence["microbatches"] == 4 and f.fixes == [], [x.summary for x in f.fixes]
    few = Job(header={**header, "gradient_accumulation_steps": 2})  # the micro-batch fix stays
    few.each_step(lambda r, s: few.comm(r, s, op="recv", at_ms=30, dur_ms=30, group_ranks=[0, 1]))
    (g,) = fired(few.write(str(tmp_path / "few")), "pipeline_bubble")
    assert [x.ds_config["gradient_accumulation_steps"] for x in g.fixes] == [4]


def test_pipeline_bubble_fixes_skip_what_the_job_has(tmp_path):
    """4 microbatches over 2 stages already meet 4(p-1); one layer per stage cannot be interleaved."""
    argv = [
        "pretrain_gpt.py",
        "--pipeline-model-parallel-size",
        "2",
        "--num-layers",
        "2",
        "--micro-batch-size",
        "1",
    ]
    job = Job(header={"argv": argv, "pp": 2, "dp": 1, "num_microbatches": 4})
    job.each_step(
        lambda r, s: job.comm(r, s, op="send" if r == 0 else "recv", at_ms=20, dur_ms=50, group_ranks=[0, 1])
    )
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    assert f.fixes == []
    silent = Job(header={"argv": argv, "pp": 2})  # microbatches unknown: the premise is not measured
    silent.each_step(
        lambda r, s: silent.comm(
            r, s, op="send" if r == 0 else "recv", at_ms=20, dur_ms=50, group_ranks=[0, 1]
        )
    )
    assert fired(silent.write(str(tmp_path / "m")), "pipeline_bubble") == []


def test_idle_time_spent_in_collectives_is_not_the_data_loader(tmp_path):
    job = Job(gap_ms=40)
    # every rank all-reduces through the whole gap after its step (e.g. a step boundary placed early)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=100.5, dur_ms=40))
    assert fired(job.write(str(tmp_path)), "idle_between_steps") == []
    (f,) = fired(Job(gap_ms=40).write(str(tmp_path / "idle")), "idle_between_steps")
    assert f.recoverable_s == pytest.approx(0.040, abs=1e-6)


def test_tiny_collectives_silent_without_sizes(tmp_path):
    job = Job()
    job.each_step(lambda r, s: [job.comm(r, s, nbytes=0, at_ms=10 + i, dur_ms=0.5) for i in range(40)])
    assert fired(job.write(str(tmp_path)), "tiny_collectives") == []


def test_tiny_collectives_no_bucket_advice_at_default_buckets_or_dp1(tmp_path):
    small_buckets = {"zero_optimization": {"stage": 1, "reduce_bucket_size": 1e6}}
    for n, header in enumerate(
        (
            {"zero_stage": 1, "ds_config": {"zero_optimization": {"stage": 1}}},
            {"zero_stage": 1, "dp": 1, "ds_config": small_buckets},
        )
    ):
        job = Job(header=header)
        for r in range(job.ranks):
            for s in range(job.steps):
                for i in range(40):
                    job.comm(r, s, nbytes=4096, at_ms=10 + i, dur_ms=0.5)
        (f,) = fired(job.write(str(tmp_path / str(n))), "tiny_collectives")
        assert f.fixes == []
    small = Job(
        header={"zero_stage": 1, "ds_config": {"zero_optimization": {"stage": 1, "reduce_bucket_size": 1e6}}}
    )
    small.each_step(lambda r, s: [small.comm(r, s, nbytes=4096, at_ms=10 + i, dur_ms=0.5) for i in range(40)])
    (f,) = fired(small.write(str(tmp_path / "small")), "tiny_collectives")
    assert f.fixes[0].ds_config == {"zero_optimization": {"reduce_bucket_size": 4_000_000}}


def test_hpz_size_is_ranks_per_node(tmp_path):
    def gathers(job: Job) -> Job:
        job.each_step(lambda r, s: [job.comm(r, s, at_ms=20 + 20 * i, nbytes=4 << 20) for i in range(3)])
        job.each_step(
            lambda r, s: job.comm(
                r, s, op="all_gather_into_tensor", module="wte", at_ms=5, dur_ms=30, nbytes=64 << 20
            )
        )
        return job

    z3 = {"zero_stage": 3, "ds_config": {"zero_optimization": {"stage": 3}}}
    (f,) = fired(gathers(Job(header=z3)).write(str(tmp_path / "one")), "embedding_comm")
    assert f.fixes[0].ds_config == {"zero_optimization": {"zero_quantized_weights": True}}  # one host
    two = gathers(Job(ranks=4, header=z3, hosts=["a", "a", "b", "b"]))
    (f,) = fired(two.write(str(tmp_path / "two")), "embedding_comm")
    assert f.fixes[0].ds_config["zero_optimization"]["zero_hpz_partition_size"] == 2


def test_a_plain_torch_loop_gets_no_deepspeed_fix() -> None:
    """A DDP job numbers its own steps (diag's step_origin `loop:step`): no DeepSpeed engine ran
    it, so exposed_comm's `overlap_comm` patch (offered "if the job uses DeepSpeed ZeRO" while the
    framework was unknown: the nanoGPT user trial) names a knob the job does not have."""
    from diag.analyzers.exposed_comm import _fixes

    import diag

    tr = diag.load(str(ROOT / "sample_traces" / "ddp_contention"))
    job = framework.detect(tr)
    assert (job.framework, job.deepspeed) == (framework.TORCH, False), job.why
    assert _fixes(tr, job) == []
