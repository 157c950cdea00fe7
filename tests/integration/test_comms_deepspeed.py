"""The comms collector inside a real 2-rank DeepSpeed ZeRO-3 job (tests.workloads.gpt_ds), against
ground truth taken in the same run: torch.profiler's `c10d::` ops (counts) and DeepSpeed's comms
logger (bytes); and the same job with every comms hook forced to raise."""

from __future__ import annotations

import json
import os

import pytest

import diag
from tests.integration import truth
from tests.workloads import launch

pytestmark = pytest.mark.slow

ARGS = ["--zero", "3", "--steps", "2", "--truth", "--comms-logger", "--what", "comms"]


def _run(folder: str, env: dict[str, str] | None = None) -> tuple[dict, diag.Trace]:
    out, trace = os.path.join(folder, "result.json"), os.path.join(folder, "trace")
    launch.run("tests.workloads.gpt_ds", [*ARGS, "--diag", "--trace-dir", trace, "--out", out], env=env)
    with open(out) as f:
        return json.load(f), diag.load(trace)


@pytest.fixture(scope="module")
def zero3(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, diag.Trace]:
    return _run(str(tmp_path_factory.mktemp("z3")))


@pytest.fixture(scope="module")
def zero3_faulty(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, diag.Trace]:
    return _run(str(tmp_path_factory.mktemp("z3f")), env={"DIAG_FAULTS": "comms=raise"})


def test_counts_match_profiler_and_bytes_match_comms_logger(zero3) -> None:
    result, trace = zero3
    for r in range(2):
        counts, nbytes = truth.agent_comms(trace.comms, r)
        expected = truth.profiler_counts(result["ranks"][r])
        assert counts == expected and expected["all_gather"] > 0 and expected["reduce_scatter"] > 0
        assert nbytes == truth.ds_bytes(result["ranks"][r], group_size=2)
    assert set(trace.comms["group_size"]) == {2}
    assert trace.comms["dur"].notna().all()
    assert trace.errors.empty, trace.errors.to_dict("records")


def test_zero3_gathers_are_attributed_to_modules(zero3) -> None:
    _, trace = zero3
    c = trace.comms
    first = c[(c["op"] == "all_gather") & (c["step"] == 1)]["module"].dropna().astype(str)
    assert {"module.blocks.0.mlp.fc1", "module.head"} <= set(first)


def test_faults_keep_training_and_count_every_collective(zero3, zero3_faulty) -> None:
    good, _ = zero3
    bad, trace = zero3_faulty
    assert bad["losses"] == good["losses"]
    assert trace.comms.empty
    errs = trace.errors[trace.errors["collector"].astype(str) == "comms"]
    assert set(errs["exc"].astype(str)) == {"InjectedFault"}
    for r in range(2):
        idle = errs["where"].astype(str).isin(("groups-recheck", "drop-groups"))  # the writer's, not a call
        mine = errs[(errs["rank"] == r) & ~idle]
        counted = mine.groupby(mine["where"].astype(str))["count"].max().sum()
        assert counted == sum(truth.profiler_counts(bad["ranks"][r]).values())
