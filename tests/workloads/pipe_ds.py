"""The small GPT as a DeepSpeed PipelineModule on 2 stages (PP=2, CPU/gloo), trained with the real
PipelineEngine's `train_batch`: `torchrun --nproc_per_node=2 -m tests.workloads.pipe_ds`.

Stage 0 holds the embeddings and the first half of the blocks, stage 1 the rest, the final norm, the
output layer and the loss. `--micro-batches` is DeepSpeed's gradient_accumulation_steps, which is the
micro-batch count of the pipeline schedule (1F1B: a bubble of (p-1)/(m+p-1) of the step). Ground
truth beside the agent: the p2p sends/recvs and their bytes, from torch.profiler's c10d ops.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import nn

from tests.workloads import common, shims
from tests.workloads.gpt import Block, batch


class Paced(nn.Module):
    """Each forward and each backward takes at least `pace_s` of wall time (a sleep tops the real work
    up): stage times then follow the block count, as on a dedicated GPU, not the load of a shared CPU,
    so the measured bubble can be held against the schedule's own. Forward and backward are paced
    alike: DeepSpeed's schedule alternates them in lockstep across stages, so a backward unlike the
    forward adds a bubble of its own (measured: 0.27 instead of 0.06 at m=16 with B = 2/3 F)."""

    pace_s = 0.0

    def paced(self, x: torch.Tensor, run: Any) -> torch.Tensor:
        if not self.pace_s:
            return run(x)
        t0 = time.perf_counter()
        if x.requires_grad:
            x = _BackwardPace.apply(x, self)
        y = run(x)
        _sleep_until(t0 + self.pace_s)
        if y.requires_grad:
            y.register_hook(self._backward_starts)
        return y

    def _backward_starts(self, grad: torch.Tensor) -> torch.Tensor:
        self.backward_t0 = time.perf_counter()
        return grad


class _BackwardPace(torch.autograd.Function):
    """Identity on a layer's input: its backward runs when the layer's backward is done, and waits
    until `pace_s` has passed since that backward began."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Paced) -> torch.Tensor:
        ctx.layer = layer
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        _sleep_until(getattr(ctx.layer, "backward_t0", 0.0) + ctx.layer.pace_s)
        return grad, None


def _sleep_until(t: float) -> None:
    left = t - time.perf_counter()
    if left > 0:
        time.sleep(left)


class Embed(nn.Module):
    def __init__(self, vocab: int, hidden: int, seq: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))


class PacedBlock(Paced):
    def __init__(self, hidden: int, heads: int, pace_ms: float = 0.0) -> None:
        super().__init__()
        self.block = Block(hidden, heads)
        self.pace_s = pace_ms / 1000

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.paced(x, self.block)


class Head(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))


class FinalNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_f(x)


def tied_logits(embed: Embed, x: torch.Tensor) -> torch.Tensor:
    """The output logits with the input embedding's weight, as a TiedLayerSpec's `forward_fn` (the
    way Megatron-DeepSpeed's GPTModelPipe computes them): a function, which no module hook sees."""
    return F.linear(x, embed.wte.weight)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.base_parser(__doc__)
    common.add_size_args(p)
    p.add_argument(
        "--micro-batches",
        type=int,
        default=8,
        help="micro-batches per step (DeepSpeed's gradient_accumulation_steps)",
    )
    p.add_argument(
        "--pace-ms",
        type=float,
        default=0.0,
        help="least wall time of each block's forward and of its backward (see Paced)",
    )
    p.add_argument(
        "--tied",
        action="store_true",
        help="tie the output layer to the embedding (TiedLayerSpec with a forward_fn, as GPTModelPipe)",
    )
    p.add_argument(
        "--init-pause",
        type=float,
        default=0.0,
        help="seconds of pause inside deepspeed.initialize, after the engine has global_steps and "
        "before its layout (as a large model's initialize takes seconds): see slow_initialize",
    )
    p.set_defaults(layers=4, batch=2)
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> Any:
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    blocks = [LayerSpec(PacedBlock, args.hidden, args.heads, args.pace_ms) for _ in range(args.layers)]
    if args.tied:  # [Embed, B0, B1] | [B2, B3, FinalNorm, logits]: the embedding lives on both stages
        embed = ("embed", Embed, args.vocab, args.hidden, args.seq)
        layers = [
            TiedLayerSpec(*embed, tied_weight_attr="wte.weight"),
            *blocks,
            LayerSpec(FinalNorm, args.hidden),
            TiedLayerSpec(*embed, forward_fn=tied_logits, tied_weight_attr="wte.weight"),
        ]
    else:
        layers = [
            LayerSpec(Embed, args.vocab, args.hidden, args.seq),
            *blocks,
            LayerSpec(Head, args.vocab, args.hidden),
        ]
    # uniform partitioning by layer count: [Embed, B0, B1] | [B2, B3, Head] for 4 blocks
    return PipelineModule(
        layers=layers,
        num_stages=2,
        loss_fn=lm_loss,
        partition_method="uniform",
        activation_checkpoint_interval=0,
    )


def ds_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": args.micro_batches,
        "steps_per_print": 10**9,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 0},
        "log_level": "warning",
    }


def data(args: argparse.Namespace) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-batches in order: step s, micro-batch i gets the deterministic batch(s * m + i)."""
    n = 0
    while True:
        yield batch(n, 0, args.batch, args.seq, args.vocab)
        n += 1


def slow_initialize(pause: float) -> None:
    """A pause before DeepSpeedEngine sets its data-parallel layout: the agent under `diag run` scans
    for engines every flush (0.2 s), so its scan lands inside the engine's `__init__` (CI once saw
    a header without `dp` that way, by chance)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    configure = DeepSpeedEngine._configure_distributed_model

    def paused(self: Any, model: Any) -> Any:
        time.sleep(pause)
        return configure(self, model)

    DeepSpeedEngine._configure_distributed_model = paused  # type: ignore[method-assign]


def train(args: argparse.Namespace, prof: Any) -> dict[str, Any]:
    import deepspeed

    if args.init_pause:
        slow_initialize(args.init_pause)

    deepspeed.init_distributed(dist_backend="gloo")  # PipelineModule builds its grid with deepspeed.comm
    torch.manual_seed(args.seed)
    model = build(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # a config optimizer would JIT-build FusedAdam
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(args))
    it = data(args)
    losses, times, iterations = [], [], []
    for step in range(args.steps):
        common.maybe_detach(args, engine.global_rank, step)
        t0 = time.perf_counter()
        loss = engine.train_batch(data_iter=it)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        iterations.append(int(engine.global_steps))
        if prof is not None:
            prof.step()
    return {
        "losses": losses,
        "step_times": times,
        "iterations": iterations,
        "stage": engine.stage_id,
        "num_stages": engine.num_stages,
        "micro_batches": engine.micro_batches,
    }


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    shims.deepspeed_cpu()
    rank, _ = common.init_process_group()
    with common.agent_if(args), common.profiled(args, rank) as prof:
        mine = train(args, prof)
    if args.truth and prof is not None:
        mine["truth_comms"] = prof.as_dict()
    common.write_result(
        args,
        rank,
        mine,
        {
            "workload": "pipe_ds",
            "steps": args.steps,
            "micro_batches": args.micro_batches,
            "pace_ms": args.pace_ms,
            "model": common.model_shape(args),
        },
    )
    common.finish()


if __name__ == "__main__":
    main()
