"""A rank alone in its process group (size 1: Megatron-DeepSpeed TP=2 on 2 ranks has a ZeRO
data-parallel group of one per rank) moves nothing between ranks: its calls' time is no
communication in any figure or rule. On the real job they were 2.6 ms a step of "communication"."""

from __future__ import annotations

import pytest

from diag.metrics import breakdown, comms
from diag.metrics.stage import Metrics
from tests.unit.synth_trace import Job, fired


def _with_lone_calls(dur_ms: float = 45.0, n: int = 1) -> Job:
    """Per step: one 5 ms all-reduce between both ranks and `n` calls of `dur_ms` each rank makes
    alone in its own group (ZeRO's DP group of one)."""
    job = Job()

    def step(r: int, s: int) -> None:
        job.comm(r, s, at_ms=80, dur_ms=5)
        for i in range(n):
            at = 10 + i * (dur_ms + 0.1)
            job.comm(r, s, at_ms=at, dur_ms=dur_ms, nbytes=1, group=str(15 + r), group_ranks=[r])

    job.each_step(step)
    return job


def test_lone_calls_are_not_communication(tmp_path):
    trace = _with_lone_calls().write(str(tmp_path))
    m = Metrics(trace)
    assert set(m.comms["group"].astype(str)) == {"world"}
    split = m.step_split.set_index("rank")
    assert split["comm_pct"].tolist() == pytest.approx([5.0, 5.0])  # the 5 ms between ranks only
    stats = breakdown.collective_stats(trace)
    assert stats["time_ns"].tolist() == [8 * 5_000_000] * 2
    assert fired(trace, "exposed_comm") == []  # 45 ms alone + 5 ms was read as 50% exposed
    assert int(comms.alone(trace.comms).sum()) == 16  # 8 steps x 2 ranks


def test_lone_tiny_calls_are_no_tiny_collectives(tmp_path):
    trace = _with_lone_calls(dur_ms=0.5, n=40).write(str(tmp_path))
    assert fired(trace, "tiny_collectives") == []


def test_a_size_one_without_members_is_kept(tmp_path):
    """An importer that knew no world size writes size 1 with no members: not measured as alone."""
    trace = _with_lone_calls().write(str(tmp_path))
    c = trace.comms.assign(group_ranks=None)
    assert not comms.alone(c).any()


def test_live_exposed_share_leaves_lone_calls_out():
    """`diag top` and the Prometheus exporter's exposed share: the same calls, live."""
    from diag.tui.model import JobModel

    m = JobModel()
    for rank in (0, 1):
        m.add(rank, {"k": "step", "step": 3, "ts": 0, "dur": 100})
        m.add(
            rank,
            {"k": "comm", "step": 3, "op": "all_reduce", "dur": 45, "group_size": 1, "group_ranks": [rank]},
        )
        m.add(
            rank,
            {"k": "comm", "step": 3, "op": "all_reduce", "dur": 5, "group_size": 2, "group_ranks": [0, 1]},
        )
    assert [m.ranks[r].exposed_share() for r in (0, 1)] == [0.05, 0.05]
