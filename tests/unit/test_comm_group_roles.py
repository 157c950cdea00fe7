"""Group roles from megatron-core's real parallel_state (a one-rank gloo group, expert parallel on).

Megatron-LM's run_simple_mcore_train_loop.py made MoE (alltoall dispatcher, EP=2) showed its
tokens-per-expert all_gather under a bare c10d id (`all_gather [24]`): the dispatcher calls on
`_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP`, a group object of its own even where its ranks are EP's.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from diag.collectors.comms import groups

ps = pytest.importorskip("megatron.core.parallel_state", reason="megatron-core is not installed")


@pytest.fixture(scope="module")
def megatron_groups(tmp_path_factory: pytest.TempPathFactory):
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ps.initialize_model_parallel(expert_model_parallel_size=1)
    yield ps
    ps.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("held", "role"),
    [
        ("_EXPERT_MODEL_PARALLEL_GROUP", "ep"),
        ("_EXPERT_DATA_PARALLEL_GROUP", "ep_dp"),
        ("_EXPERT_TENSOR_PARALLEL_GROUP", "ep_tp"),
        ("_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "tp_ep"),
        ("_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "tp_ep_pp"),
        ("_TENSOR_AND_DATA_PARALLEL_GROUP", "tp_dp"),
        ("_TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp_cp"),
        ("_TENSOR_MODEL_PARALLEL_GROUP", "tp"),
    ],
)
def test_each_megatron_group_is_named_for_its_role(megatron_groups, held: str, role: str) -> None:
    pg = getattr(megatron_groups, held)
    assert groups.role_of(pg) == role
    name, size, ranks = groups.describe(pg)
    assert name == f"{role}:{pg.group_name}" and size == 1 and ranks == (0,)


def test_every_group_megatron_holds_has_a_role(megatron_groups) -> None:
    """A group megatron-core adds in a later release shows up here, not as a bare id in a report."""
    held = {
        n: g
        for n, g in vars(megatron_groups).items()
        if n.startswith("_") and n.endswith(("GROUP", "GROUP_GLOO")) and isinstance(g, dist.ProcessGroup)
    }
    assert "_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP" in held
    assert {n for n, g in held.items() if groups.role_of(g) is None} == set()
