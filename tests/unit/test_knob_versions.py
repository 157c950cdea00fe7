"""A fix names only knobs the job's framework has at the job's version (issue 11): the version ranges
in analyzers/knob_table.py, read from the release tags of NVIDIA/Megatron-LM and microsoft/DeepSpeed
by scripts/knob_table.py, decide; renamed arguments come in the job's own spelling."""

from __future__ import annotations

import copy

import pytest
from diag.analyzers import framework, knob_table, run_all

from diag.findings import Fix
from tests.unit.synth_trace import Job

MLM = framework.MEGATRON_LM


def mlm_job(core: str | None, **args: str) -> framework.Job:
    return framework.Job(framework=MLM, version=core, args=dict(args))


@pytest.mark.parametrize(
    ("flag", "before", "since"),
    [
        ("--ddp-bucket-size", "0.6.0", "0.7.0"),
        ("--decoder-first-pipeline-num-layers", "0.8.0", "0.9.0"),
        ("--num-virtual-stages-per-pipeline-rank", "0.10.0", "0.11.0"),
    ],
)
def test_a_flag_is_offered_only_from_its_release_on(flag, before, since):
    assert not mlm_job(before).has_flag(flag)
    assert mlm_job(since).has_flag(flag)
    assert mlm_job(since + "rc1").has_flag(flag)  # a pre-release of a version with it
    assert mlm_job(None).has_flag(flag)  # no version recorded: the newest table


def test_a_removed_flag_is_not_offered_after_its_last_release():
    lo, hi = knob_table.RANGES["megatron-lm"][1]["--use-custom-fsdp"]
    assert hi is not None and framework.version_key(lo) <= (0, 12, 0) <= framework.version_key(hi)
    assert mlm_job("0.12.0").has_flag("--use-custom-fsdp")
    assert not mlm_job("0.15.0").has_flag("--use-custom-fsdp")
    assert not mlm_job(None).has_flag("--use-custom-fsdp")


def test_a_renamed_flag_comes_in_the_jobs_spelling():
    names = ("--use-megatron-fsdp", "--use-custom-fsdp")
    assert mlm_job("0.12.0").spelling(*names) == "--use-custom-fsdp"
    assert mlm_job("0.15.0").spelling(*names) == "--use-megatron-fsdp"
    assert mlm_job("0.4.0").spelling(*names) is None  # neither exists yet: no fix
    # a job that passed one spelling keeps it where its version has both
    both = ("--recompute-activations", "--checkpoint-activations")
    assert mlm_job("0.12.0").spelling(*both) == "--recompute-activations"
    assert mlm_job("0.12.0", checkpoint_activations=True).spelling(*both) == "--checkpoint-activations"


def test_versions_outside_the_releases_read_are_judged_by_the_nearest():
    versions = knob_table.RANGES["megatron-lm"][0]
    assert framework.version_key(versions[0]) <= (0, 4, 0)
    assert mlm_job("0.1.0").has_flag("--overlap-grad-reduce") == mlm_job(versions[0]).has_flag(
        "--overlap-grad-reduce"
    )
    assert mlm_job("99.0.0").has_flag("--ddp-bucket-size")


@pytest.mark.parametrize(
    ("key", "section", "before", "since"),
    [
        ("zero_hpz_partition_size", "zero_optimization", "0.9.5", "0.10.0"),
        ("zero_quantized_weights", "zero_optimization", "0.9.5", "0.10.0"),
        ("stage3_prefetch_bucket_size", "zero_optimization", "0.3.10", "0.3.12"),
        ("bf16", None, "0.5.10", "0.6.0"),
    ],
)
def test_ds_config_keys_follow_the_deepspeed_release(key, section, before, since):
    old = framework.Job(framework=framework.DEEPSPEED, deepspeed_version=before)
    new = framework.Job(framework=framework.DEEPSPEED, deepspeed_version=since)
    assert not old.has_ds_key(key, section)
    assert new.has_ds_key(key, section)
    patch = {section: {key: 1}} if section else {key: {"enabled": True}}
    assert not old.applicable(Fix("x", ds_config=patch)) and new.applicable(Fix("x", ds_config=patch))


def test_every_key_of_the_installed_deepspeed_is_in_the_ranges_or_always_there():
    versions, spans = knob_table.RANGES["zero_optimization"]
    assert versions[-1] == knob_table.DEEPSPEED_VERSION and len(versions) > 50
    for key in knob_table.ZERO_KEYS:
        assert spans.get(key, (versions[0], None))[1] is None, key  # the newest release has it


def _mlm_pipeline(core: str) -> Job:
    """Megatron-LM, 4 stages of 2 layers, 1 microbatch: half of each step waits on send/recv."""
    header = {
        "argv": [
            "pretrain_gpt.py",
            "--pipeline-model-parallel-size",
            "4",
            "--num-layers",
            "8",
            "--micro-batch-size",
            "4",
            "--global-batch-size",
            "4",
        ],
        "megatron": core,
        "pp": 4,
        "gradient_accumulation_steps": 1,
        "dtype": "bf16",
    }
    job = Job(ranks=4, header=copy.deepcopy(header))
    job.each_step(lambda r, s: job.comm(r, s, op="send" if r % 2 == 0 else "recv", at_ms=20, dur_ms=50))
    return job


def test_a_planted_bubble_gets_the_flags_of_the_jobs_release(tmp_path):
    """The stage-balancing flags exist from megatron.core 0.9: a 0.8 job is not told them."""
    got = {}
    for core in ("0.8.0", "0.9.0"):
        trace = _mlm_pipeline(core).write(str(tmp_path / core))
        findings, failures = run_all(trace, only=["pipeline_bubble"])
        assert failures == {} and [f.rule for f in findings] == ["pipeline_bubble"]
        got[core] = {a for fix in findings[0].fixes for a in fix.megatron_args if a.startswith("--")}
    assert "--decoder-first-pipeline-num-layers" in got["0.9.0"]
    assert "--decoder-first-pipeline-num-layers" not in got["0.8.0"]
    assert got["0.8.0"]  # the flags 0.8 has are still offered


def test_the_registry_drops_a_fix_the_jobs_release_lacks(tmp_path):
    """Whichever rule made it: a ZeRO++ key (DeepSpeed 0.10+) is dropped for a 0.9 job, kept for 0.10."""
    from diag.analyzers import base

    from diag.findings import Finding

    def planted(trace, metrics):
        return [
            Finding(
                severity="info",
                title="t",
                detail="d",
                fixes=[
                    Fix("hpz", ds_config={"zero_optimization": {"zero_hpz_partition_size": 8}}),
                    Fix("overlap", ds_config={"zero_optimization": {"overlap_comm": True}}),
                ],
            )
        ]

    fn = base.rule("test_knob_filter")(planted)
    try:
        for ds, want in (("0.9.0", ["overlap"]), ("0.10.0", ["hpz", "overlap"])):
            header = {"zero_stage": 3, "deepspeed": ds, "ds_config": {"zero_optimization": {}}}
            (f,) = fn(Job(header=header).write(str(tmp_path / ds)))
            assert [x.summary for x in f.fixes] == want
    finally:
        del base._RULES["test_knob_filter"]
