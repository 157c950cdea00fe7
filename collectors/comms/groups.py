"""Process-group identity for comm records: name, size and global ranks, resolved once per group.

The name is the group's role where the job's framework holds it (`tp`, `pp`, `dp`, `cp`, `ep`, ...
from megatron's parallel_state, `dp`, `ep`, `sp`, ... from DeepSpeed's groups, `pp`/`tp`/`dp`/`mp`
from the grid of DeepSpeed's PipelineEngine, `world` for the default group) joined to c10d's group
name, which is the same on every member rank and tells the TP groups of different ranks apart:
`tp:1`, `dp:5`, `world:0`; a group no framework holds keeps the bare c10d name. Cached by `id(pg)`
with a weak reference to check identity, so a destroyed group is neither kept alive nor confused
with a new one that reuses its address.

A framework may take a group on after its first collectives: DeepSpeed's PipelineEngine broadcasts
on its grid's groups before its p2p module keeps the grid, so under `diag run` they were bare ids
for the whole job. The writer thread looks at bare groups again for `RECHECK_S` (`recheck`, never on
the hot path); one that gains a role is renamed from then on, and its bare entry in the `groups`
meta says `renamed` to what, which the reader applies to the records written before.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

GroupInfo = tuple[str, int, "tuple[int, ...] | None"]
RECHECK_S = 60.0  # how long after its first call a bare group may still be given a role
# (module, its global holding a group or a {name: group} dict, role), most specific role first:
# one group object held under two names (TP = model parallel when PP = 1) takes the first
ROLES = (
    ("megatron.core.parallel_state", "_TENSOR_MODEL_PARALLEL_GROUP", "tp"),
    ("megatron.core.parallel_state", "_CONTEXT_PARALLEL_GROUP", "cp"),
    ("megatron.core.parallel_state", "_PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    ("megatron.core.parallel_state", "_EXPERT_MODEL_PARALLEL_GROUP", "ep"),
    ("megatron.core.parallel_state", "_SEQUENCE_PARALLEL_GROUP", "sp"),
    ("megatron.core.parallel_state", "_DATA_PARALLEL_GROUP", "dp"),
    ("megatron.core.parallel_state", "_DATA_PARALLEL_GROUP_GLOO", "dp"),
    ("megatron.core.parallel_state", "_DATA_PARALLEL_GROUP_WITH_CP", "dp_cp"),
    ("megatron.core.parallel_state", "_SEQUENCE_DATA_PARALLEL_GROUP", "sp_dp"),
    ("megatron.core.parallel_state", "_EXPERT_DATA_PARALLEL_GROUP", "ep_dp"),
    ("megatron.core.parallel_state", "_EXPERT_DATA_PARALLEL_GROUP_GLOO", "ep_dp"),
    # the MoE groups megatron-core's token dispatchers and expert layers call on (its
    # ProcessGroupCollection names them tp_ep, expt_tp, tp_ep_pp): the alltoall dispatcher
    # all-gathers its tokens-per-expert counts on tp_ep, a different group object from ep
    ("megatron.core.parallel_state", "_EXPERT_TENSOR_PARALLEL_GROUP", "ep_tp"),
    ("megatron.core.parallel_state", "_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "tp_ep"),
    ("megatron.core.parallel_state", "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "tp_ep_pp"),
    ("megatron.core.parallel_state", "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP", "ep_dp"),
    ("megatron.core.parallel_state", "_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP", "ep_dp_inter"),
    ("megatron.core.parallel_state", "_TENSOR_AND_DATA_PARALLEL_GROUP", "tp_dp"),
    ("megatron.core.parallel_state", "_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "tp_dp_cp"),
    ("megatron.core.parallel_state", "_TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp_cp"),
    ("megatron.core.parallel_state", "_INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "dist_opt"),
    ("megatron.core.parallel_state", "_MODEL_PARALLEL_GROUP", "mp"),
    ("megatron.core.parallel_state", "_EMBEDDING_GROUP", "embd"),
    ("megatron.core.parallel_state", "_POSITION_EMBEDDING_GROUP", "pos_embd"),
    ("deepspeed.utils.groups", "_EXPERT_PARALLEL_GROUP", "ep"),
    ("deepspeed.utils.groups", "_SEQUENCE_PARALLEL_GROUP", "sp"),
    ("deepspeed.utils.groups", "_DATA_PARALLEL_GROUP", "dp"),
    ("deepspeed.utils.groups", "_EXPERT_DATA_PARALLEL_GROUP", "ep_dp"),
    ("deepspeed.utils.groups", "_SEQUENCE_DATA_PARALLEL_GROUP", "sp_dp"),
    ("deepspeed.utils.groups", "_ZERO_PARAM_INTRA_PARALLEL_GROUP", "zero_hpz"),
    ("deepspeed.utils.groups", "_WORLD_GROUP", "world"),
    # DeepSpeed's own Ulysses groups (Arctic long-sequence training, its HF integration)
    ("deepspeed.runtime.sequence_parallel.parallel_state_sp", "_SEQUENCE_PARALLEL_GROUP", "sp"),
    ("deepspeed.runtime.sequence_parallel.parallel_state_sp", "_SEQUENCE_DATA_PARALLEL_GROUP", "sp_dp"),
    # DeepSpeed's PipelineEngine builds its own groups on a PipelineParallelGrid, which its p2p module
    # keeps as `_grid`: "model" there is the pipeline x tensor slice of one data-parallel replica
    ("deepspeed.runtime.pipe.p2p", "_groups", "pp"),
    ("deepspeed.runtime.pipe.p2p", "_grid.pp_proc_group", "pp"),
    ("deepspeed.runtime.pipe.p2p", "_grid.slice_proc_group", "tp"),
    ("deepspeed.runtime.pipe.p2p", "_grid.dp_proc_group", "dp"),
    ("deepspeed.runtime.pipe.p2p", "_grid.ds_model_proc_group", "mp"),
)


def _held(module: str, path: str) -> Any:
    """The object at `path` (dotted attributes) in the loaded `module`, None where any part is missing."""
    held: Any = sys.modules.get(module)
    for attr in path.split("."):
        held = getattr(held, attr, None)
    return held


def role_of(pg: Any) -> str | None:
    """The role the job's framework gives `pg`, `world` for the default group, else None."""
    for module, path, role in ROLES:
        held = _held(module, path)
        if isinstance(held, dict):
            held = list(held.values())
        if held is pg or (isinstance(held, list | tuple) and any(g is pg for g in held)):
            return role
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_initialized() and pg is dist.distributed_c10d._get_default_group():
            return "world"
    except Exception:  # noqa: BLE001 - no default group (being destroyed): no role
        pass
    return None


def describe(pg: Any) -> GroupInfo:
    """(name, size, global ranks). The name is the role and c10d's group_name (see above)."""
    import torch.distributed as dist

    name = str(getattr(pg, "group_name", "") or pg.name())
    role = role_of(pg)
    size = int(pg.size())
    try:
        ranks: tuple[int, ...] | None = tuple(int(r) for r in dist.get_process_group_ranks(pg))
    except Exception:  # noqa: BLE001 - a group c10d does not track (made by hand): ranks unknown
        ranks = None
    return (f"{role}:{name}" if role else name), size, ranks


def _entry(role: str | None, size: int, ranks: tuple[int, ...] | None) -> dict[str, Any]:
    """A group as the `groups` meta record lists it."""
    return {"role": role, "size": size, "ranks": list(ranks) if ranks else None}


class Groups:
    """`info(pg)` is one dict lookup and one weakref call on the hot path. Each new group is passed
    to `on_new(groups)` with every group seen so far ({name: {"role", "size", "ranks"}}): the
    agent writes it as the `groups` meta record, which readers merge into the layout. `on_bare()`
    says a bare group now waits for `recheck`."""

    def __init__(
        self,
        on_new: Callable[[dict[str, Any]], None] | None = None,
        on_bare: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache: dict[int, tuple[weakref.ref[Any], GroupInfo]] = {}
        self._bare: dict[int, tuple[weakref.ref[Any], float]] = {}  # id -> (group, first seen)
        self.seen: dict[str, dict[str, Any]] = {}
        self.on_new, self.on_bare, self.clock = on_new, on_bare, clock

    def info(self, pg: Any) -> GroupInfo:
        hit = self.cache.get(id(pg))
        if hit is not None and hit[0]() is pg:
            return hit[1]
        info = describe(pg)
        ref = weakref.ref(pg)
        self.cache[id(pg)] = (ref, info)
        name, size, ranks = info
        if name not in self.seen:
            role = name.split(":", 1)[0] if ":" in name else None
            self.seen[name] = _entry(role, size, ranks)
            if self.on_new is not None:
                self.on_new(dict(self.seen))
        if ":" not in name:
            self._bare[id(pg)] = (ref, self.clock())
            if self.on_bare is not None:
                self.on_bare()
        return info

    def recheck(self) -> bool:
        """Writer thread: give each bare group the role a framework holds it under now (see the
        module's docstring). True once no bare group is left to look at (an idle listener)."""
        now, renamed = self.clock(), False
        for key, (ref, since) in list(self._bare.items()):
            pg, hit = ref(), self.cache.get(key)
            if pg is None or hit is None or hit[0]() is not pg or now - since > RECHECK_S:
                self._bare.pop(key, None)  # gone, replaced, or kept by no framework: bare for good
                continue
            role = role_of(pg)
            if role is not None:
                self._bare.pop(key, None)
                bare, size, ranks = hit[1]
                name = f"{role}:{bare}"
                self.cache[key] = (ref, (name, size, ranks))
                self.seen[name] = _entry(role, size, ranks)
                self.seen[bare] = {**_entry(None, size, ranks), "renamed": name}
                renamed = True
        if renamed and self.on_new is not None:
            self.on_new(dict(self.seen))
        return not self._bare

    def clear(self) -> None:
        self.cache.clear()
        self._bare.clear()
