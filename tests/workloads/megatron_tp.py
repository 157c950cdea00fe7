"""Train a tiny megatron-core GPTModel with tensor parallel size 2 on CPU/gloo:
`torchrun --nproc_per_node=2 -m tests.workloads.megatron_tp`.

Plain torch AdamW on the TP-sharded parameters (data-parallel size 1, so no gradient all-reduce):
every collective in the run is one of megatron's tensor-parallel mappings.

`--tp 1 --pp 2` runs the same model as two pipeline stages instead, through megatron-core's own
1F1B schedule (`get_forward_backward_func`, `--micro` micro-batches per step, activations sent by
its p2p communication): each stage holds `--layers / 2` layers, numbered locally
(`decoder.layers.0`, ...) with megatron's global `layer_number` on each.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

import torch

from tests.workloads import common, shims
from tests.workloads.gpt import batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.base_parser(__doc__)
    common.add_slow_args(p)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--micro", type=int, default=4, help="micro-batches per step under --pp")
    common.add_size_args(p)
    return p.parse_args(argv)


def build_model(args: argparse.Namespace, moe: dict[str, Any] | None = None) -> Any:
    """The GPT of `args` on CPU; `moe` (TransformerConfig's MoE fields) makes its MLPs experts."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    moe = moe or {}
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        expert_model_parallel_size=moe.get("expert_model_parallel_size", 1),
    )
    torch.manual_seed(args.seed)
    model_parallel_cuda_manual_seed(args.seed, inference_rng_tracker=True)
    config = TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        tensor_model_parallel_size=args.tp,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        pipeline_model_parallel_size=args.pp,
        pipeline_dtype=torch.float32,
        batch_p2p_comm=False,
        **moe,
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(num_experts=moe.get("num_moe_experts")),
        vocab_size=args.vocab,
        max_sequence_length=args.seq,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )


def train(args: argparse.Namespace, prof: Any, model: Any = None) -> dict[str, Any]:
    """Train `model` (built from `args` where None) for `args.steps` steps; the result's dict."""
    from megatron.core import parallel_state

    model = build_model(args) if model is None else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dp_rank = parallel_state.get_data_parallel_rank()
    pos = torch.arange(args.seq).unsqueeze(0).expand(args.batch, -1)
    mask = torch.tril(torch.ones(1, 1, args.seq, args.seq)) < 0.5  # True = masked out

    def loss_at(step: int) -> torch.Tensor:
        tokens, targets = batch(step, dp_rank, args.batch, args.seq, args.vocab)
        return model(tokens, pos, mask, labels=targets).mean()

    if args.pp > 1:
        return train_pipelined(args, prof, model, opt, pos, mask)
    return common.train_loop(args, prof, opt, loss_at, model)


def train_pipelined(
    args: argparse.Namespace, prof: Any, model: Any, opt: Any, pos: torch.Tensor, mask: torch.Tensor
) -> dict[str, Any]:
    """One step = megatron-core's pipeline schedule over `--micro` micro-batches, then AdamW. The
    last stage reports the mean micro-batch loss; the first stage's is NaN (it computes none)."""
    import time

    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fwd_bwd = get_forward_backward_func()
    last = parallel_state.is_pipeline_last_stage()
    losses, times = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        micro = iter(
            [batch(step * args.micro + i, 0, args.batch, args.seq, args.vocab) for i in range(args.micro)]
        )

        def forward_step(data: Any, model: Any) -> tuple[torch.Tensor, Any]:
            tokens, targets = next(data)
            out = model(tokens, pos, mask, labels=targets)
            return out, lambda o: (o.mean() / args.micro, {"loss": o.mean().detach()})

        opt.zero_grad(set_to_none=True)
        res = fwd_bwd(
            forward_step_func=forward_step,
            data_iterator=micro,
            model=[model],
            num_microbatches=args.micro,
            seq_length=args.seq,
            micro_batch_size=args.batch,
            forward_only=False,
        )
        opt.step()
        losses.append(float(torch.stack([r["loss"] for r in res]).mean()) if last else float("nan"))
        if args.step_sleep:
            time.sleep(args.step_sleep)
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    return {"losses": losses, "step_times": times}


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    shims.megatron_cpu()
    shims.eager_compile()
    if args.pp > 1:
        shims.megatron_pipeline_cpu()
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
            "workload": "megatron_tp",
            "tp": args.tp,
            "pp": args.pp,
            "steps": args.steps,
            "model": common.model_shape(args),
        },
    )
    common.finish()


if __name__ == "__main__":
    main()
