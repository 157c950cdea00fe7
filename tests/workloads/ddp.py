"""Plain PyTorch DistributedDataParallel on CPU/gloo: the most common torchrun job, and the one whose
gradient all-reduces come from C++ (DDP's Reducer calls the ProcessGroup directly, past every Python
wrapper). Small buckets (`--bucket-mb`) give several all-reduces per step."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

import torch
from torch.nn.parallel import DistributedDataParallel

from tests.workloads import common, planted


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.base_parser(__doc__)
    common.add_slow_args(p)
    planted.add_args(p)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bucket-mb", type=float, default=0.02, help="DDP's bucket_cap_mb")
    return p.parse_args(argv)


def train(args: argparse.Namespace, rank: int, prof: Any) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
    model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(args.seed + rank)

    def loss_at(_step: int) -> torch.Tensor:
        return model(torch.randn(args.batch, args.hidden, generator=gen)).pow(2).mean()

    out = common.train_loop(args, prof, opt, loss_at, model)
    return {**out, "bucket_sizes": str(model._get_ddp_logging_data().get("bucket_sizes", ""))}


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    rank, _ = common.init_process_group()
    with common.agent_if(args), common.profiled(args, rank) as prof:
        mine = train(args, rank, prof)
    if args.truth and prof is not None:
        mine["truth_comms"] = prof.as_dict()
    common.write_result(args, rank, mine, {"workload": "ddp", "steps": args.steps})
    common.finish()


if __name__ == "__main__":
    main()
