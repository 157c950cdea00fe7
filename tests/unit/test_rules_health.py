"""Health rules on synthetic traces: overflow, memory, straggler, idle gaps, pipeline bubble, hangs."""

from __future__ import annotations

import pytest

from diag import schema
from tests.unit.synth_trace import MS, Job, fired
from tests.unit.test_rules_comm import healthy

FP16 = {
    "zero_stage": 1,
    "dtype": "fp16",
    "ds_config": {"fp16": {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 1000}},
}


def overflow_job(overflow_steps: set[int], steps: int = 12) -> Job:
    job = Job(steps=steps, header=FP16)
    for r in range(job.ranks):
        scale = 2.0**8
        for s in range(steps):
            hit = s in overflow_steps
            before, scale = scale, scale / 2 if hit else scale
            job.add(
                r,
                schema.OVERFLOW,
                step=s,
                ts=job.start(r, s) + 90 * MS,
                overflow=hit,
                scale_before=before,
                scale_after=scale,
                skipped_steps=0,
                source="update_scale",
            )
    return job


def test_overflow_calibration_is_not_a_storm(tmp_path):
    assert fired(overflow_job({0, 1, 2}).write(str(tmp_path)), "overflow_storm") == []


def test_overflow_storm_severity_is_the_skipped_share(tmp_path):
    """3 skipped steps of 29 after calibration (10%: the storm's threshold) cost a tenth of the run: a
    warning, where 3 of 11 (test below) are critical."""
    (f,) = fired(overflow_job({0, 5, 15, 25}, steps=30).write(str(tmp_path)), "overflow_storm")
    assert f.evidence["time_lost_share"] == pytest.approx(3 / 29) and f.severity == "warning"


def test_overflow_storm_after_calibration(tmp_path):
    (f,) = fired(overflow_job({0, 4, 6, 8}).write(str(tmp_path)), "overflow_storm")
    assert f.evidence["overflow_steps"] == 3 and f.steps == [4, 6, 8]  # per step, not per rank-step
    assert f.evidence["min_scale"] == 16
    # 3 skipped of the 11 steps after calibration: 27% of the recorded steps' time thrown away
    assert f.evidence["time_lost_share"] == pytest.approx(3 / 11) and f.severity == "critical"
    assert "of recorded steps (27%)" in f.detail
    assert f.fixes[0].ds_config["bf16"] == {"enabled": True}
    # the job already starts at 2^8: no lower start is offered (issue 11), the window and hysteresis are
    assert f.fixes[1].ds_config["fp16"] == {"loss_scale_window": 2000, "hysteresis": 4}
    high = overflow_job({0, 4, 6, 8})
    high.header = {
        **FP16,
        "ds_config": {
            "fp16": {"enabled": True, "initial_scale_power": 16, "hysteresis": 4, "loss_scale_window": 2000},
            "gradient_clipping": 1.0,
        },
    }
    (f,) = fired(high.write(str(tmp_path / "high")), "overflow_storm")
    # clipping is already on: no clipping fix
    assert [x.ds_config for x in f.fixes][1:] == [{"fp16": {"initial_scale_power": 12}}]


def test_loss_scale_collapse_is_critical(tmp_path):
    (f,) = fired(overflow_job({0, *range(3, 12)}).write(str(tmp_path)), "overflow_storm")
    assert f.severity == "critical" and f.evidence["min_scale"] == 0.25


def memory_job(alloc: float, reserved: float, cap: float | None, peak: float | None = None) -> Job:
    job = Job(header={"zero_stage": 1})
    job.each_step(
        lambda r, s: job.add(
            r,
            schema.MEMORY,
            step=s,
            ts=job.start(r, s) + 99 * MS,
            device="cuda:0",
            allocated=int(alloc),
            reserved=int(reserved),
            peak=int(peak or alloc),
            capacity=cap,
            rss=1,
            module=None,
        )
    )
    return job


def test_fragmentation_is_reserved_against_the_peak_not_the_allocation_after_the_step(tmp_path):
    """Issue 11: reserved 14 GiB, 3.3 GiB allocated after the iteration, 12 GiB max allocated: 1.17x
    the peak, not 10.7 GiB of fragmentation."""
    gib = 2**30
    job = memory_job(3.3 * gib, 14 * gib, 80 * gib, peak=12 * gib)
    assert fired(job.write(str(tmp_path)), "memory_pressure") == []


def test_memory_near_capacity_and_fragmentation(tmp_path):
    gib = 2**30
    (near,) = fired(memory_job(130 * gib, 131 * gib, 140 * gib).write(str(tmp_path / "a")), "memory_pressure")
    assert near.evidence["peak_share"] == pytest.approx(130 / 140) and near.severity == "warning"
    (frag,) = fired(memory_job(20 * gib, 40 * gib, 140 * gib).write(str(tmp_path / "b")), "memory_pressure")
    assert frag.evidence["stranded_bytes"] == 20 * gib
    # fragmentation is the allocator's: sharding or offloading state is no fix for it (issue 11)
    assert [f.env for f in frag.fixes] == [{"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}]
    calm = memory_job(60 * gib, 70 * gib, 140 * gib).write(str(tmp_path / "c"))
    assert fired(calm, "memory_pressure") == []


def test_straggler_found_by_compute_not_step_time(tmp_path):
    job = Job(ranks=4)
    # rank 2 computes 40 ms longer; the others wait that long in the step's all-reduce
    job.each_step(lambda r, s: job.comm(r, s, at_ms=60 if r != 2 else 95, dur_ms=45 if r != 2 else 5))
    (f,) = fired(job.write(str(tmp_path)), "straggler")
    assert f.ranks == [2] and f.evidence["ratio"] == pytest.approx(95 / 55, rel=1e-3)
    assert f.recoverable_s == pytest.approx(0.040)
    assert fired(healthy().write(str(tmp_path / "ok")), "straggler") == []


def test_idle_between_steps(tmp_path):
    job = Job(gap_ms=30)
    (f,) = fired(job.write(str(tmp_path)), "idle_between_steps")
    assert f.recoverable_s == pytest.approx(0.030, abs=1e-6)
    assert f.evidence["gap_share"][0] == pytest.approx(30 / 130, abs=1e-6)


def _forward(job: Job, r: int, s: int, lead_ms: float, module: str = "module") -> None:
    """A 20 ms forward of rank r's step s, `lead_ms` after the step's start (its idle lead-in)."""
    job.add(
        r,
        schema.LAYER,
        step=s,
        module=module,
        phase="fwd",
        ts=job.start(r, s) + int(lead_ms * MS),
        dur=20 * MS,
        flops=0,
        mem_delta=None,
    )


def test_idle_lead_in_before_first_forward(tmp_path):
    slow, fast = Job(gap_ms=0), Job(gap_ms=0)  # steps recorded boundary to boundary, as the collector does
    slow.each_step(lambda r, s: _forward(slow, r, s, 25))
    fast.each_step(lambda r, s: _forward(fast, r, s, 1))
    (f,) = fired(slow.write(str(tmp_path / "slow")), "idle_between_steps")
    assert f.recoverable_s == pytest.approx(0.025, abs=1e-6)
    assert fired(fast.write(str(tmp_path / "fast")), "idle_between_steps") == []


def test_idle_lead_in_on_one_sampled_step_is_not_an_input_stall(tmp_path):
    """Layers sampled every 50 steps give one measured lead-in in a short job: a 15 ms descheduling
    of that one step under load (a fault-matrix run) is no input pipeline; 3 steady such steps are."""

    def layers(sampled: set[int]) -> Job:
        job = Job(steps=8, gap_ms=0)
        for r in range(job.ranks):
            for s in range(job.steps):
                if s in sampled:
                    _forward(job, r, s, 25 if r == 1 else 1, module="m")
        return job

    assert fired(layers({5}).write(str(tmp_path / "one")), "idle_between_steps") == []
    (f,) = fired(layers({2, 3, 5, 7}).write(str(tmp_path / "three")), "idle_between_steps")
    assert f.ranks == [1]


def test_pipeline_bubble_above_schedule(tmp_path):
    job = Job(ranks=2, header={"pp": 2, "gradient_accumulation_steps": 8})
    job.each_step(lambda r, s: job.comm(r, s, op="recv", at_ms=0, dur_ms=40 if r else 10, group_ranks=[0, 1]))
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    assert f.evidence["bubble_ideal"] == pytest.approx(1 / 8)
    assert f.evidence["bubble_measured"] == pytest.approx(40 / 60) and f.ranks == [1]
    ok = Job(ranks=2, header={"pp": 2, "gradient_accumulation_steps": 8})
    ok.each_step(lambda r, s: ok.comm(r, s, op="recv", at_ms=0, dur_ms=8, group_ranks=[0, 1]))
    assert fired(ok.write(str(tmp_path / "ok")), "pipeline_bubble") == []


def test_pipeline_bubble_counts_microbatches_from_the_sends(tmp_path):
    """The configured 8 is not what ran: each end stage sends once per micro-batch, 2 a step (plus
    shape messages on the warm-up step), so m = 2 and the schedule's bubble is (p-1)/m = 0.5."""
    job = Job(ranks=2, header={"pp": 2, "gradient_accumulation_steps": 8})

    def step(r: int, s: int) -> None:
        for i in range(2 + (3 if s == 0 else 0)):
            job.comm(r, s, op="send", nbytes=4096, at_ms=5 * i, dur_ms=1, group_ranks=[0, 1])
        job.comm(r, s, op="recv", at_ms=20, dur_ms=40 if r else 10, group_ranks=[0, 1])

    job.each_step(step)
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    ev = f.evidence
    assert (ev["microbatches"], ev["microbatches_source"], ev["microbatches_configured"]) == (2, "sends", 8)
    assert ev["sends_per_step_by_rank"] == {0: 2, 1: 2}
    assert ev["bubble_ideal"] == pytest.approx(1 / 2) and ev["bubble_fraction_ideal"] == pytest.approx(1 / 3)
    assert "counted from the pipeline's sends" in f.detail


def test_pipeline_bubble_takes_the_fewest_sends_over_stages(tmp_path):
    """A middle stage sends twice per micro-batch (activations on, gradients back): 4 stages, m = 3."""
    job = Job(ranks=4, header={"pp": 4})
    sends = {0: 3, 1: 6, 2: 6, 3: 3}

    def step(r: int, s: int) -> None:
        for i in range(sends[r]):
            job.comm(r, s, op="send", nbytes=4096, at_ms=2 * i, dur_ms=1, group_ranks=[0, 1, 2, 3])
        job.comm(r, s, op="recv", at_ms=30, dur_ms=50, group_ranks=[0, 1, 2, 3])

    job.each_step(step)
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    assert (f.evidence["microbatches"], f.evidence["microbatches_source"]) == (3, "sends")
    assert f.evidence["microbatches_configured"] is None  # nothing recorded: counted all the same


def test_pipeline_bubble_leaves_shape_messages_out_of_the_count(tmp_path):
    """Megatron-DeepSpeed's pipeline (DeepSpeed's engine, TP=2 x PP=2, measured): a 72-byte int64
    shape message before every 4096-byte activation or gradient; 4 micro-batches, 8 sends a step."""
    job = Job(ranks=2, header={"pp": 2, "gradient_accumulation_steps": 4})

    def step(r: int, s: int) -> None:
        for i in range(4):
            job.comm(r, s, op="send", nbytes=72, at_ms=10 * i, dur_ms=1, group_ranks=[0, 1])
            job.comm(r, s, op="send", nbytes=4096, at_ms=10 * i + 2, dur_ms=1, group_ranks=[0, 1])
        job.comm(r, s, op="recv", at_ms=50, dur_ms=40, group_ranks=[0, 1])

    job.each_step(step)
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    assert (f.evidence["microbatches"], f.evidence["microbatches_source"]) == (4, "sends")
    assert f.evidence["sends_per_step_by_rank"] == {0: 4, 1: 4}


def test_hang_desync_rank_stopped_and_diverged(tmp_path):
    job = healthy()
    job.comm(0, 7, op="broadcast", nbytes=8, at_ms=90, dur_ms=1)  # rank 0 alone in one more collective
    (f,) = fired(job.write(str(tmp_path / "a")), "hang_desync")
    assert f.evidence["diverged_groups"]["world"][0]["op"] == "broadcast" and f.ranks == [0, 1]
    stuck = Job(steps=8)
    trace = stuck.write(str(tmp_path / "b"))
    trace.frames["step"] = trace.steps[(trace.steps["rank"] != 1) | (trace.steps["step"] < 3)]
    (g,) = fired(trace, "hang_desync")
    assert g.evidence["behind"] == [1]


def test_pipeline_bubble_recoverable_follows_the_measure(tmp_path):
    """m=2, p=2: the schedule alone leaves (p-1)/m = 0.5. Megatron-DeepSpeed's PP=2 runs read 1.4 ms
    recoverable at a measured 0.52 and 22.8 ms at 0.49 (two formulas either side of 0.5). It is the
    bubble above what 4(p-1) microbatches leave, (p-1)/4 = 0.25, times compute: close measures,
    close figures."""

    def run(name: str, recv_ms: float) -> object:
        job = Job(ranks=2, header={"pp": 2, "gradient_accumulation_steps": 2})

        def step(r: int, s: int) -> None:
            for i in range(2):
                job.comm(r, s, op="send", nbytes=4096, at_ms=5 * i, dur_ms=1, group_ranks=[0, 1])
            job.comm(r, s, op="recv", at_ms=20, dur_ms=recv_ms, group_ranks=[0, 1])

        job.each_step(step)
        (f,) = fired(job.write(str(tmp_path / name)), "pipeline_bubble")
        return f

    below, above = run("below", 30.0), run("above", 33.0)
    for f in (below, above):
        measured = f.evidence["bubble_measured"]
        compute = f.evidence["time_at_stake_s"] / (1 + measured)
        assert f.recoverable_s == pytest.approx((measured - 0.25) * compute)
    assert below.evidence["bubble_measured"] < 0.5 < above.evidence["bubble_measured"]
    assert below.recoverable_s == pytest.approx(above.recoverable_s, rel=0.3)


def test_pipeline_bubble_of_an_unbalanced_split_says_so(tmp_path):
    """DeepSpeedExamples' AlexNet split by parameters (every convolution on stage 0): stage 1 waited
    0.50 of its compute, stage 0 0.15 at a schedule's 0.125, and diag named the fill and drain, with a
    fix naming `partition_method='parameters'`, the method the job used. An unbalanced split is said
    as such; its fix names the knob, no value; equal stages waiting alike get no balancing fix."""
    header = {"pp": 2, "gradient_accumulation_steps": 8, "pipeline_engine": "deepspeed"}
    job = Job(ranks=2, header=header)
    job.each_step(lambda r, s: job.comm(r, s, op="recv", at_ms=0, dur_ms=40 if r else 10, group_ranks=[0, 1]))
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    assert f.title.startswith("pipeline stages unbalanced: rank 1 waits"), f.title
    assert "(p-1)/m = 0.125" in f.title and f.ranks == [1]
    (fix,) = [x for x in f.fixes if "partition_method" in x.summary]
    assert "move layers from rank 0's stage" in fix.summary and "='" not in fix.summary, fix.summary
    even = Job(ranks=2, header=header)
    even.each_step(lambda r, s: even.comm(r, s, op="recv", at_ms=0, dur_ms=40, group_ranks=[0, 1]))
    (g,) = fired(even.write(str(tmp_path / "even")), "pipeline_bubble")
    assert g.title.startswith("pipeline bubble ") and not any(
        "partition_method" in x.summary for x in g.fixes
    )


def test_pipeline_bubble_calls_no_split_unbalanced_that_costs_nothing(tmp_path):
    """Megatron-LM's run_simple_mcore_train_loop.py at PP=2 with one microbatch (CPU): stage 1 waited
    1.27 of its compute, stage 0 0.38 at the schedule's (p-1)/m = 1, and diag called the stages
    unbalanced while its own estimate said the imbalance cost 0 us a step. Here stage 0 computes 90 ms
    of a 100 ms step and stage 1 44 ms: an even split at the schedule's bubble would take 2 x 67 ms,
    longer than the step, so the finding is the schedule's bubble, not an unbalanced split."""
    header = {"pp": 2, "gradient_accumulation_steps": 1}
    job = Job(ranks=2, header=header)
    job.each_step(lambda r, s: job.comm(r, s, op="recv", at_ms=0, dur_ms=56 if r else 10, group_ranks=[0, 1]))
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    assert f.title.startswith("pipeline bubble 1.27 vs the schedule's (p-1)/m = 1"), f.title
    assert f.recoverable_s > 0 and not any("balance" in x.summary for x in f.fixes)


def test_pipeline_bubble_of_a_megatron_core_loop_names_its_num_microbatches(tmp_path):
    """Megatron-LM's run_simple_mcore_train_loop.py at PP=2 runs megatron-core's schedule from its
    own loop with num_microbatches=1: a 49% bubble, critical, and no fix (the fixes were Megatron-LM
    arguments and DeepSpeed settings, neither of which the program has)."""
    header = {"pp": 2, "gradient_accumulation_steps": 1, "megatron": "0.16.1"}
    job = Job(ranks=2, header=header)
    job.each_step(lambda r, s: job.comm(r, s, op="recv", at_ms=0, dur_ms=48, group_ranks=[0, 1]))
    (f,) = fired(job.write(str(tmp_path)), "pipeline_bubble")
    (fix,) = f.fixes
    assert fix.summary.startswith("pass num_microbatches=4 (not 1) to megatron-core's forward_backward_func")
    assert "divided by 4 " in fix.summary and not fix.megatron_args and not fix.ds_config
    plain = Job(ranks=2, header={k: v for k, v in header.items() if k != "megatron"})
    plain.each_step(lambda r, s: plain.comm(r, s, op="recv", at_ms=0, dur_ms=48, group_ranks=[0, 1]))
    (g,) = fired(plain.write(str(tmp_path / "plain")), "pipeline_bubble")
    assert not any("num_microbatches" in x.summary for x in g.fixes)
