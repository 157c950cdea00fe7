"""Plain DDP under torchrun: its gradient all-reduces come from C++ (the Reducer) and must be
recorded like any other collective (issue 17: 0 collectives were seen on a public DDP program)."""

from __future__ import annotations

import pytest

from tests.integration import truth
from tests.integration.runs import DDP, Job, Runs

pytestmark = pytest.mark.slow

STEPS = 4
ARGS = ["--steps", str(STEPS), "--truth"]


@pytest.fixture(scope="module")
def pair(runs: Runs) -> tuple[Job, Job]:
    return runs.get(DDP, ARGS, diag=True), runs.get(DDP, ARGS, diag=False)


def test_losses_bit_identical_with_agent(pair: tuple[Job, Job]) -> None:
    on, off = pair
    assert [on.rank(r)["losses"] for r in range(2)] == [off.rank(r)["losses"] for r in range(2)]


def test_every_collective_the_profiler_saw_is_recorded_once(pair: tuple[Job, Job]) -> None:
    """torch.profiler counts every c10d dispatcher op, whoever called it: DDP's start-up broadcasts
    (Python) and the Reducer's bucket all-reduces (C++) alike; none may be missing or doubled."""
    on, _ = pair
    for r in range(2):
        counts, _ = truth.agent_comms(on.trace.comms, r)
        expected = truth.profiler_counts(on.rank(r))
        assert counts == expected
        assert counts.get("all_reduce", 0) > STEPS  # small buckets: more than one in a step


def test_bucket_all_reduces_are_timed_to_completion(pair: tuple[Job, Job]) -> None:
    on, _ = pair
    c = on.trace.comms
    ar = c[c["op"].astype(str) == "all_reduce"]
    assert ar["dur"].notna().all() and (ar["dur"] >= 0).all()
    assert (ar["bytes"] > 0).all() and set(ar["group_size"]) == {2}
    assert on.trace.errors.empty, on.trace.errors.to_dict("records")


def test_bucket_all_reduces_carry_no_module(pair: tuple[Job, Job]) -> None:
    """The Reducer issues a bucket when its last gradient is ready, during whichever module's backward
    produced it: that module is not what the bucket carries (nanoGPT's one bucket of every parameter
    was attributed to `transformer.wte`, and embedding_comm called it embedding traffic)."""
    on, _ = pair
    c = on.trace.comms
    ar = c[c["op"].astype(str) == "all_reduce"]
    assert len(ar) > STEPS and ar["module"].isna().all(), ar["module"].value_counts(dropna=False)
