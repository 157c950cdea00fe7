"""Every analyzer scenario, from traces of real runs (sample_traces/<scenario>): its rule fires with the
numbers the scenario was built to produce, and the healthy baseline stays silent."""

from __future__ import annotations

import os
import subprocess

import pytest
from diag.analyzers import run_all

import diag
from sample_traces import netns
from sample_traces.generate_scenarios import SCENARIOS, generate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = os.path.join(ROOT, "sample_traces")
NAMES = list(SCENARIOS)  # the healthy baseline is sample_traces.generate's


def findings(name: str) -> dict[str, list]:
    out: dict[str, list] = {}
    fs, failures = run_all(diag.load(os.path.join(TRACES, name)))
    assert failures == {}
    for f in fs:
        out.setdefault(f.rule, []).append(f)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_scenario_flags_its_rule(name):
    got = findings(name)
    assert set(SCENARIOS[name].flags) <= set(got), f"{name}: fired {sorted(got)}"
    with open(os.path.join(TRACES, name, "README.md")) as f:
        assert "Must flag: " + ", ".join(f"`{r}`" for r in SCENARIOS[name].flags) in f.read()


@pytest.mark.parametrize("name", NAMES)
def test_scenario_is_small(name):
    folder = os.path.join(TRACES, name)
    assert sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) < 1_000_000


def test_healthy_baseline_is_silent():
    assert findings("healthy") == {}


def test_embedding_heavy_names_the_embedding():
    (f,) = findings("embedding_heavy")["embedding_comm"]
    assert any(layer.endswith(("wte", "head")) for layer in f.layers)
    assert f.evidence["step_share"] >= 0.20 and f.evidence["comm_share"] >= 0.40


def test_zero3_slow_link_crosses_hosts():
    (f,) = findings("zero3_slow_link")["zero3_slow_link"]
    assert f.evidence["hosts"] == ["node-a", "node-b"]
    assert f.evidence["busbw_gbs"] < 0.01  # 40 Mbit/s = 5 MB/s on the wire
    assert f.fixes[0].ds_config["zero_optimization"]["zero_quantized_weights"] is True


def test_overflow_storm_collapses_the_scale():
    (f,) = findings("overflow_storm")["overflow_storm"]
    assert f.severity == "critical" and f.evidence["min_scale"] <= 1
    assert set(range(3, 11)) <= set(f.steps)


def test_straggler_is_rank_1():
    (f,) = findings("straggler")["straggler"]
    assert f.ranks == [1] and f.evidence["gap_s"] == pytest.approx(0.080, abs=0.03)


@pytest.mark.slow
def test_generator_regenerates_straggler(tmp_path):
    generate("straggler", str(tmp_path))
    (f,) = [x for x in run_all(diag.load(str(tmp_path / "straggler")))[0] if x.rule == "straggler"]
    assert f.ranks == [1]


@pytest.mark.slow
def test_slow_link_namespaces_are_removed():
    why = netns.unavailable()
    if why:
        pytest.skip(reason=f"slow links cannot be built here: {why}")
    with netns.slow_link("100mbit", tag="t1") as (a, b):
        assert a.netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert a.netns not in left and b.netns not in left


def test_input_stall_measures_the_sleep():
    (f,) = findings("input_stall")["idle_between_steps"]
    assert f.recoverable_s == pytest.approx(0.060, abs=0.015)  # the loop sleeps 60 ms per step


@pytest.mark.parametrize(
    "name,fires,quiet",
    [
        ("fp16_overflow", {"overflow_storm"}, {"straggler"}),
        ("zero3", set(), {"zero3_slow_link", "straggler"}),  # one host: no slow link to blame
        ("megatron_tp2", set(), {"tp_cross_node"}),  # the TP group stays inside the host
    ],
)
def test_base_scenarios_agree_with_their_readmes(name, fires, quiet):
    if not os.path.isdir(os.path.join(TRACES, name)):
        pytest.skip(reason=f"sample_traces/{name} not generated (python -m sample_traces.generate {name})")
    got = set(findings(name))
    assert fires <= got and not (quiet & got), f"{name}: fired {sorted(got)}"
