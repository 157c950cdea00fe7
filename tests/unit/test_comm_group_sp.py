"""DeepSpeed-Ulysses groups are named `sp` and give the layout its SP degree.

Megatron-DeepSpeed's `--ds-sequence-parallel-size 2` (2 ranks) showed `TP=1 PP=1 DP=1` for 2 ranks:
its all-to-alls were on a group named `sp`, but the layout kept no SP. DeepSpeed's own Ulysses
(Arctic long-sequence training) holds its groups in `parallel_state_sp`, which no role named.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist
from diag.collectors import comms
from diag.collectors.comms import groups

sp_state = pytest.importorskip(
    "deepspeed.runtime.sequence_parallel.parallel_state_sp", reason="this DeepSpeed has no parallel_state_sp"
)


class _Meta:
    """What the agent is told (the agent's `set_meta`, the one thing `_new_group` calls)."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}

    def set_meta(self, key: str, value: Any) -> None:
        self.meta[key] = value


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.new_group([0])
    dist.destroy_process_group()


def test_deepspeed_ulysses_group_is_sp_and_sets_the_layout(one_rank, monkeypatch) -> None:
    monkeypatch.setattr(sp_state, "_SEQUENCE_PARALLEL_GROUP", one_rank)
    assert groups.role_of(one_rank) == "sp"
    agent = _Meta()
    seen = groups.Groups(on_new=lambda s: comms._new_group(agent, s))
    name, size, _ = seen.info(one_rank)
    assert name == f"sp:{one_rank.group_name}" and agent.meta["sp"] == size == 1
    assert agent.meta["groups"][name]["role"] == "sp"
