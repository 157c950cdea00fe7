"""One prepared device check of every CUDA path (run on a GPU machine: `python -m bench.gpu_check`).

CPU machines test these paths through fakes behind seams; this script runs the real ones once and
prints one line per check (PASS/FAIL + numbers), so a session with a lent GPU spends its minutes on
one call. Checks: per-layer CUDA-event timing resolved without synchronize and bit-identical losses;
torch.cuda memory stats in memory events; a 1-GPU NCCL process group with sync and async
collectives timed by CUDA events; NVML sidecar fields; always-on overhead ratio on a GPU step.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable

import torch

import diag
from diag import agent

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, info: str = "") -> None:
    RESULTS.append((name, ok, info))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {info}", flush=True)


class Tiny(torch.nn.Module):
    def __init__(self, vocab: int = 1024, d: int = 256) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True) for _ in range(2)
        )
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def train(steps: int) -> list[float]:
    torch.manual_seed(0)
    model = Tiny().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1024, (8, 128), device="cuda")
    losses = []
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1).float(), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses


def traced(fn: Callable[[], object], **opts: object) -> tuple[object, diag.Trace]:
    d = tempfile.mkdtemp(prefix="diag-gpu-")
    agent.start(d, **opts)
    try:
        out = fn()
    finally:
        agent.stop()
    return out, diag.load(d)


def check_layers_and_memory() -> None:
    ref = train(4)
    got, tr = traced(lambda: train(4), what="steps,layers,memory", layers_every=1)
    check("losses bit-identical with layers+memory", got == ref, f"{got[-1]!r} vs {ref[-1]!r}")
    lay = tr.layers
    check(
        "layer durations resolved from CUDA events",
        len(lay) > 0 and lay["dur"].notna().all(),
        f"{len(lay)} records, {int(lay['dur'].isna().sum()) if len(lay) else 0} null",
    )
    check("layer mem_delta present on CUDA", len(lay) > 0 and lay["mem_delta"].notna().any(), "")
    mem = tr.memory
    ok = len(mem) > 0 and (mem["allocated"] > 0).all() and (mem["capacity"] > 0).all()
    check(
        "memory events from torch.cuda stats",
        bool(ok),
        f"peak {mem['peak'].max() / 2**20:.0f} MiB of {mem['capacity'].max() / 2**30:.0f} GiB"
        if len(mem)
        else "none",
    )
    check("no collector errors", tr.errors.empty, str(tr.errors.to_dict("records"))[:300])


def check_nccl() -> None:
    import torch.distributed as dist

    store = dist.FileStore(tempfile.mktemp(prefix="diag-nccl-"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda:0"))
    x = torch.ones(1 << 20, device="cuda")

    def run() -> None:
        for _ in range(5):
            dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        out = torch.empty(1 << 20, device="cuda")
        dist.all_gather_into_tensor(out, x)
        torch.cuda.synchronize()

    try:
        _, tr = traced(run, what="comms")
    finally:
        dist.destroy_process_group()
    c = tr.comms
    check("NCCL collectives recorded", len(c) == 7, f"{len(c)} records: {c['op'].tolist()}")
    check(
        "NCCL durations resolved (CUDA events)",
        len(c) > 0 and c["dur"].notna().all(),
        f"median {c['dur'].median() / 1e3:.1f} us" if len(c) else "",
    )
    check("bytes of all_reduce 4 MiB", len(c) > 0 and int(c["bytes"].iloc[0]) == 4 << 20, "")


def check_nvml() -> None:
    from diag.nvml.sidecar import selfcheck

    check("NVML sidecar fields", selfcheck() == 0, "see the lines above")


def check_overhead() -> None:
    def steps() -> float:
        t = time.perf_counter()
        train(20)
        return time.perf_counter() - t

    bare, on = [], []
    for _ in range(3):
        bare.append(steps())
        _, _ = traced(lambda: on.append(steps()))
    ratio = min(on) / min(bare)
    check("always-on overhead on GPU (goal < 1%)", ratio < 1.01, f"x{ratio:.4f}")


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this script is for the GPU machine", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for fn in (check_layers_and_memory, check_nccl, check_nvml, check_overhead):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - report and go on to the next check
            check(fn.__name__, False, f"{type(exc).__name__}: {exc}")
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
