"""DeepSpeed-Ulysses sequence parallelism on CPU/gloo:
`torchrun --nproc_per_node=2 -m tests.workloads.ulysses_ds`.

Each rank holds 1/SP of every sequence; DeepSpeed's `DistributedAttention` all-to-alls Q, K, V
(sequence-sharded -> head-sharded) around a plain attention and the output back, on the group
DeepSpeed's `parallel_state_sp` builds. Megatron-DeepSpeed's `--ds-sequence-parallel-size` runs the
same layer on its own group.
Per layer and step: 4 all-to-alls forward, 4 backward. Deterministic, so losses compare bit for bit.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import nn

from tests.workloads import common, shims
from tests.workloads.gpt import batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.base_parser(__doc__)
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=1)
    common.add_size_args(p)
    return p.parse_args(argv)


class LocalAttention(nn.Module):
    """Attention over the whole sequence on this rank's heads: [s, b, h, d] in and out."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (x.permute(1, 2, 0, 3) for x in (q, k, v))  # [b, h, s, d]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(2, 0, 1, 3)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, group: Any) -> None:
        from deepspeed.sequence.layer import DistributedAttention

        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attn = DistributedAttention(LocalAttention(), group)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [s/sp, b, hidden]
        s, b, hidden = x.shape
        q, k, v = self.qkv(x).view(s, b, 3, self.heads, hidden // self.heads).unbind(2)
        out = self.attn(q.contiguous(), k.contiguous(), v.contiguous(), 1)  # batch is dim 1
        return x + self.proj(out.reshape(s, b, hidden))


class Model(nn.Module):
    def __init__(self, args: argparse.Namespace, group: Any) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.blocks = nn.ModuleList(Block(args.hidden, args.heads, group) for _ in range(args.layers))
        self.head = nn.Linear(args.hidden, args.vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).transpose(0, 1)  # [s/sp, b, hidden]
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.transpose(0, 1).flatten())


def train(args: argparse.Namespace, rank: int, world: int, prof: Any) -> dict[str, Any]:
    import deepspeed
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    deepspeed.init_distributed("gloo")  # deepspeed.comm over the group torchrun's env already made
    parallel_state_sp.initialize_sequence_parallel(world)
    torch.manual_seed(args.seed)
    model = Model(args, parallel_state_sp._SEQUENCE_PARALLEL_GROUP)
    cfg = {"train_micro_batch_size_per_gpu": args.batch, "zero_optimization": {"stage": args.zero}}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    shard = args.seq // world
    losses = []
    for step in range(args.steps):
        tokens, targets = batch(step, 0, args.batch, args.seq, args.vocab)  # one sequence, split
        mine = slice(rank * shard, (rank + 1) * shard)
        loss = engine(tokens[:, mine], targets[:, mine])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if prof is not None:
            prof.step()
    return {"losses": losses, "global_steps": int(engine.global_steps)}


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    shims.deepspeed_cpu()
    rank, world = common.init_process_group()
    with common.agent_if(args), common.profiled(args, rank) as prof:
        mine = train(args, rank, world, prof)
    if args.truth and prof is not None:
        mine["truth_comms"] = prof.as_dict()
    common.write_result(
        args, rank, mine, {"workload": "ulysses_ds", "zero": args.zero, "model": common.model_shape(args)}
    )
    common.finish()


if __name__ == "__main__":
    main()
