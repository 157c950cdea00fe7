"""Write real CPU Kineto traces (torch.profiler) of a tiny 2-rank gloo data-parallel job.

Used until `python -m tests.workloads.gpt_ds --kineto DIR` exists, and by the benchmark to make
bigger inputs (`--steps`). One `rank<N>.json.gz` (or `.json`) per rank in OUT:

    python -m sample_traces.generate_kineto OUT [--steps 6] [--ranks 2] [--no-gzip] [--gpu-shape]
    python -m sample_traces.generate_kineto --scenarios   # regenerate the sample_traces/kineto_* folders

`--gpu-shape` also writes `gpu-rank<N>.json.gz`: the same real CPU run re-expressed as a CUDA trace
(no GPU here): each compute op launches a kernel on stream 7 (`cudaLaunchKernel` + correlation),
each collective gets a `record_param_comms` op and an NCCL kernel on stream 20 timed by the gloo
execution it stands for; rank 1 uses old `ncclKernel_*` names, rank 0 new `ncclDevKernel_*` ones.
Holistic Trace Analysis needs GPU kernels, so these are what we compare its figures with.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(rank: int, world: int, out: str, steps: int, gz: bool, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)),
        bucket_cap_mb=1,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = os.path.join(out, f"rank{rank}.json")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for i in range(steps + 1):
            x = torch.randn(32 * (2 if rank == 1 else 1), 256)  # rank 1 computes twice as much
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            t = torch.full((1024 * (i % 4 + 1),), float(rank))
            dist.broadcast(t, src=0)
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t)
            prof.step()
    dist.destroy_process_group()
    if gz:
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(path)


_KERNELS = {"aten::addmm": "ampere_sgemm_128x64_tn", "aten::mm": "ampere_sgemm_64x64_nn",
            "aten::relu": "void at::native::vectorized_elementwise_kernel<4, relu>",
            "aten::threshold_backward": "void at::native::elementwise_kernel<threshold_bwd>",
            "aten::pow": "void at::native::elementwise_kernel<pow>", "aten::sum": "reduce_kernel<sum>",
            "aten::mean": "reduce_kernel<mean>", "aten::add_": "void multi_tensor_apply_kernel<add>",
            "aten::randn": "Memcpy HtoD (Pageable -> Device)", "aten::fill_": "Memset (Device)"}
_NCCL = {"all_reduce": "AllReduce_Sum_f32_RING_LL", "all_gather": "AllGather_RING_LL_Sum_int8_t",
         "broadcast": "Broadcast_RING_LL_Sum_int8_t"}


def gpu_shape(doc: dict, old_nccl: bool) -> dict:
    """Re-express a real CPU trace as a CUDA one (see the module docstring)."""
    evs = doc["traceEvents"]
    pid, tid = next((e["pid"], e["tid"]) for e in evs if e.get("name", "").startswith("ProfilerStep"))
    gloo = iter(sorted((e for e in evs if e.get("name", "").startswith("gloo:")), key=lambda e: e["ts"]))
    out, free, corr = list(evs), {7: 0.0, 20: 0.0}, 1_000_000
    for e in sorted((e for e in evs if e.get("ph") == "X" and e.get("tid") == tid), key=lambda e: e["ts"]):
        name, ts, dur = e["name"], e["ts"], e["dur"]
        if name.startswith("c10d::"):
            g = next(gloo, None)
            if g is None:
                continue
            op = g["name"].split(":")[1]
            n = max(1, math.prod(g["args"]["Input Dims"][0]))
            out.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid, "tid": tid,
                        "ts": ts, "dur": dur, "args": {"Collective name": op.replace("_", ""),
                        "In msg nelems": n, "Out msg nelems": n * (2 if op == "all_gather" else 1),
                        "Group size": 2, "dtype": "Float", "Process Group Name": "0"}})
            stream, kname, kdur, kts = 20, ("ncclKernel_" if old_nccl else "ncclDevKernel_") + _NCCL.get(
                op, "AllReduce_Sum_f32_RING_LL"), g["dur"], g["ts"]
        elif name in _KERNELS:
            stream, kname, kdur, kts = 7, _KERNELS[name], max(dur * 0.6, 2.0), ts + 8
        else:
            continue
        corr += 1
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                    "ts": ts + 1, "dur": 3, "args": {"correlation": corr}})
        start, kdur = max(round(kts), free[stream]), round(kdur)  # whole us, as CUPTI-era traces
        free[stream] = start + kdur
        cat = "gpu_memcpy" if kname.startswith("Memcpy") else "gpu_memset" if kname.startswith(
            "Memset") else "kernel"
        out.append({"ph": "X", "cat": cat, "name": kname, "pid": 0, "tid": stream, "ts": start,
                    "dur": kdur, "args": {"stream": stream, "correlation": corr, "device": 0}})
    doc["traceEvents"] = out
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 (gpu-shaped CPU trace)"}]
    return doc


def write_gpu_shape(out: str, ranks: int) -> None:
    for rank in range(ranks):
        src = next(p for p in (os.path.join(out, f"rank{rank}.json{ext}") for ext in (".gz", ""))
                   if os.path.exists(p))
        opener = gzip.open if src.endswith(".gz") else open
        with opener(src, "rt") as f:
            doc = gpu_shape(json.load(f), old_nccl=rank % 2 == 1)
        with gzip.open(os.path.join(out, f"gpu-rank{rank}.json.gz"), "wt") as f:
            json.dump(doc, f)


HERE = os.path.dirname(os.path.abspath(__file__))
GPT_DS_ARGS = ["--steps", "6", "--zero", "1", "--dtype", "fp16", "--overflow-at", "2,3",
               "--log-level", "info"]


def gpt_ds_scenario(out: str) -> None:
    """A real 2-rank DeepSpeed ZeRO-1 fp16 GPT run with overflows: Kineto traces + its log."""
    import subprocess

    from tests.workloads.launch import job_env, torchrun_cmd

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "train.log"), "w") as log:
        subprocess.run(torchrun_cmd("tests.workloads.gpt_ds", [*GPT_DS_ARGS, "--kineto", out]),
                       env=job_env(), stdout=log, stderr=subprocess.STDOUT, check=True, timeout=300)
    with open(os.path.join(out, "train.log")) as f:  # keep diag-relevant DeepSpeed lines only
        lines = [ln for ln in f if "[INFO]" in ln or "OVERFLOW" in ln]
    with open(os.path.join(out, "train.log"), "w") as f:
        f.writelines(lines)
    for name in sorted(os.listdir(out)):
        if name.endswith(".json"):
            with open(os.path.join(out, name), "rb") as src, gzip.open(
                    os.path.join(out, name + ".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.remove(os.path.join(out, name))


def scenarios() -> None:
    gloo = os.path.join(HERE, "kineto_gloo_dp")
    main([gloo, "--steps", "4", "--gpu-shape"])
    gpt_ds_scenario(os.path.join(HERE, "kineto_gpt_ds_fp16"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--scenarios", action="store_true")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--no-gzip", action="store_true")
    ap.add_argument("--gpu-shape", action="store_true")
    args = ap.parse_args(argv)
    if args.scenarios:
        scenarios()
        return 0
    if not args.out:
        ap.error("OUT is required without --scenarios")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.makedirs(args.out, exist_ok=True)
    import torch.multiprocessing as mp

    mp.spawn(_train, args=(args.ranks, args.out, args.steps, not args.no_gzip, _free_port()),
             nprocs=args.ranks, join=True)
    if args.gpu_shape:
        write_gpu_shape(args.out, args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
