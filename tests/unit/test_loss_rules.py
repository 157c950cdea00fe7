"""Loss rules on real-format logs: an early spike (judged before the running baseline has history, and
never on the fast fall of early training) and a slow climb (divergence setting in over many logged
losses, which no single step shows); every healthy fixture log stays silent on both.

The planted fixtures (`megatron_loss_early_spike.log`, `megatron_loss_climb.log`) and the healthy
plateau (`megatron_loss_plateau.log`) are written by tests/fixtures/logs/write_health_logs.py in
Megatron-LM's iteration-line format with seeded figures."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from diag.analyzers import loss_climb, loss_spike, run_all

from diag.importers import load_inputs

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logs")
LOSS_RULES = {"loss_spike", "loss_climb"}
# every fixture log with a loss that is healthy (its loss, whatever else it shows)
HEALTHY = [
    "caught_exception_then_trains.log",
    "ds_pipeline.log",
    "ds_zero2_fp16.log",
    "hf_trainer_zero3_bf16.log",
    "hf_noisy_finetune.log",
    "hf_nan_loss.log",  # nan from step 120: nan_loss's, not a spike or a climb
    "megatron_deepspeed_tflops.log",
    "megatron_deepspeed_tp2_pp2.log",
    "megatron_lm_fp16.log",
    "megatron_loss_plateau.log",
    "megatron_throughput_regression.log",
    "nemo_llama_sft.log",
    "oom_megatron_after_step3.log",
]


def _findings(name: str) -> list:
    found, failures = run_all(load_inputs([os.path.join(FIX, name)]))
    assert failures == {}
    return found


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_losses_raise_no_loss_finding(name):
    assert [f.title for f in _findings(name) if f.rule in LOSS_RULES] == []


def test_an_early_spike_is_found_before_the_running_baseline_has_history():
    (f,) = _findings("megatron_loss_early_spike.log")
    assert f.rule == "loss_spike" and f.severity == "warning"  # recovered: the curve falls on
    (spike,) = f.evidence["spikes"]
    assert spike["step"] == 40 and spike["early"] is True
    assert spike["baseline"] == pytest.approx(9.915, abs=1e-3)  # the first (highest) logged loss
    assert spike["loss"] == pytest.approx(16.25, abs=0.01)
    assert f.title.startswith("early loss spike at step 40")


def test_the_early_judgement_passes_a_fast_fall_and_its_noise():
    steps = list(range(10, 90, 10))
    falling = np.array([10.9, 9.7, 9.9, 8.1, 8.6, 7.0, 7.2, 6.1])  # bumps of up to 6% on the way down
    assert loss_spike.early_spikes(falling, steps) == []
    noisy = np.array([0.8, 1.0, 0.9, 1.1, 0.7, 1.15, 0.95, 1.0])  # per-step fine-tuning noise
    assert loss_spike.early_spikes(noisy, steps) == []
    spiked = falling.copy()
    spiked[3] = 17.0
    assert [s["step"] for s in loss_spike.early_spikes(spiked, steps)] == [40]


def test_a_slow_climb_is_found_with_where_it_began():
    (f,) = _findings("megatron_loss_climb.log")
    assert f.rule == "loss_climb" and f.severity == "critical"  # still climbing at the end
    e = f.evidence
    assert 250 <= e["start_step"] <= 290 and e["end_step"] == 600
    assert e["rise"] > 0.3 and e["tau"] >= loss_climb.CLIMB_TAU and e["to_end"]
    assert f"before step {e['start_step']}" in " ".join(x.summary for x in f.fixes)


def test_the_sudden_spike_is_not_a_climb_and_the_climb_is_not_a_spike():
    assert [f.rule for f in _findings("megatron_loss_spike.log")] == ["loss_spike"]
    assert [f.rule for f in _findings("megatron_loss_climb.log")] == ["loss_climb"]


def _series(vals: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"step": np.arange(1, len(vals) + 1) * 10, "loss": vals})


def test_a_climb_that_came_back_is_a_warning_and_noise_is_no_climb():
    rng = np.random.default_rng(3)
    t = np.arange(80)
    up = np.where(t < 30, 5 - t / 15, 3 + 0.05 * (t - 30))
    back = np.where(t < 60, up, 3 + 0.05 * 30 - 0.1 * (t - 60))
    found = loss_climb.climb(_series(back * (1 + rng.normal(0, 0.01, 80))))
    assert found is not None and not found["to_end"]
    flat = 3 * (1 + rng.normal(0, 0.08, 300))
    assert loss_climb.climb(_series(flat)) is None


def test_tau_counts_rising_pairs():
    assert loss_climb.tau(np.array([1.0, 2, 3, 4])) == 1.0
    assert loss_climb.tau(np.array([4.0, 3, 2, 1])) == -1.0
    assert loss_climb.tau(np.array([1.0, 3, 2])) == pytest.approx(1 / 3)
