"""Train a tiny megatron-core MoE GPTModel with expert parallelism on CPU/gloo:
`torchrun --nproc_per_node=2 -m tests.workloads.megatron_moe` (EP=2: each rank holds
`--experts / 2` experts; the token dispatcher sends each token to its `--topk` experts' ranks).

The result file holds, per rank and step, the tokens each local expert's first linear layer got
(`expert_rows`, read from its input in a forward pre-hook): routing depends on the data, so this is
the truth per-layer FLOPs are checked against (2 x rows x hidden x ffn).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any, NoReturn

import torch

from tests.workloads import common, megatron_tp, shims


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.base_parser(__doc__)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--dispatcher", default="alltoall", choices=("alltoall", "allgather"))
    p.add_argument("--flops-every", type=int, default=None, help="the agent's flops_every (with --diag)")
    common.add_size_args(p)
    return p.parse_args(argv)


def moe_cpu() -> None:
    """What megatron-core 0.16.1's MoE layers need on CPU: the alltoall dispatcher makes a side
    `torch.cuda.Stream` for its device-to-host copies (one stand-in stream), turns its split sizes
    into host numpy arrays only for CUDA tensors (all_to_all_single refuses tensors), and the
    router reads `te_general_gemm`, undefined without Transformer Engine."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    class Stream:
        def wait_stream(self, other: Any) -> None: ...
        def synchronize(self) -> None: ...
        def record_event(self) -> Stream:
            return self

    stream = Stream()
    torch.cuda.Stream = lambda *a, **k: stream  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *a, **k: stream  # type: ignore[assignment,return-value]
    torch.cuda.stream = lambda s: contextlib.nullcontext()  # type: ignore[assignment,return-value]

    def to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        return tensor.numpy() if torch.is_tensor(tensor) and as_numpy else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host  # type: ignore[attr-defined]
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]


def build_model(args: argparse.Namespace) -> Any:
    moe = {"num_moe_experts": args.experts, "moe_router_topk": args.topk, "moe_grouped_gemm": False}
    moe |= {"expert_model_parallel_size": args.ep, "moe_token_dispatcher_type": args.dispatcher}
    return megatron_tp.build_model(argparse.Namespace(**vars(args), tp=1, pp=1), moe)


def count_rows(model: torch.nn.Module) -> dict[str, list[int]]:
    """{expert fc1 module name: rows it got, one per forward}, filled by forward pre-hooks."""
    rows: dict[str, list[int]] = {}
    for name, mod in model.named_modules():
        if ".local_experts." in name and name.endswith("linear_fc1"):
            seen = rows.setdefault(name, [])
            mod.register_forward_pre_hook(lambda m, a, seen=seen: seen.append(int(a[0].shape[0])))
    return rows


def train(args: argparse.Namespace, prof: Any) -> dict[str, Any]:
    model = build_model(args)
    rows = count_rows(model)
    out = megatron_tp.train(argparse.Namespace(**vars(args), pp=1), prof, model)
    return {**out, "expert_rows": rows}


@contextlib.contextmanager
def agent_if(args: argparse.Namespace) -> Iterator[None]:
    """common.agent_if with `--flops-every`: the agent reuses a module's FLOPs between counted
    samples of one input signature, and MoE routing changes an expert's shapes every step."""
    if not args.diag or args.flops_every is None:
        with common.agent_if(args):
            yield
        return
    from diag import agent

    agent.start(
        args.trace_dir, what=args.what, layers_every=args.layers_every or 1, flops_every=args.flops_every
    )
    try:
        yield
    finally:
        agent.stop()


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    shims.megatron_cpu()
    shims.eager_compile()
    moe_cpu()
    rank, _ = common.init_process_group()
    with agent_if(args), common.profiled(args, rank) as prof:
        mine = train(args, prof)
    common.write_result(
        args,
        rank,
        mine,
        {
            "workload": "megatron_moe",
            "ep": args.ep,
            "steps": args.steps,
            "model": common.model_shape(args),
        },
    )
    common.finish()


if __name__ == "__main__":
    main()
