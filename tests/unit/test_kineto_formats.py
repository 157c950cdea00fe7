"""Kineto shapes other than recent CUDA torch: ROCm (hip launches, fractional-microsecond times, RCCL
kernels) and the older format (`Kernel` / `Runtime` categories, no host ops at all). Both are valid
traces HTA analyzes: they are imported, never refused as malformed."""

from __future__ import annotations

import json

from diag.importers.kineto import import_file
from tests.unit.kineto_synth import Kineto


def test_old_format_without_host_ops(tmp_path):
    """HTA's trace_file_list/inference_rank_1 shape: kernels and launches only (was a pandas
    'Can only use .str accessor' error)."""
    k = Kineto(rank=1, world=2)
    k.kernel("void at::native::elementwise_kernel<128, 4>()", 100, 4, launch=90)
    k.kernel("volta_sgemm_128x64_nn", 110, 40, launch=95)
    for e in k.events:
        e["cat"] = {"kernel": "Kernel", "cuda_runtime": "Runtime"}[e["cat"]]
    rank, _, frames = import_file(k.write(tmp_path / "old.json"))
    assert rank == 1 and len(frames["kernel"]) == 2 and frames["cpu_op"].empty
    assert list(frames["kernel"]["kind"].astype(str)) == ["compute", "compute"]


def test_rocm_trace_with_rccl(tmp_path):
    k = Kineto(rank=0, world=8)
    k.step(1, 0.0, 500.5)
    k.step(2, 500.5, 500.25)
    k.host(
        "record_param_comms",
        10.125,
        5.5,
        {"Collective name": "allreduce", "In msg nelems": 256, "Out msg nelems": 256, "dtype": "BFloat16"},
    )
    k.kernel("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", 20.448, 30.72, launch=11.2)
    k.kernel("Cijk_Alik_Bljk_SB_MT64x16x32_MI16x16x1_SN", 60.961, 17.6, launch=12.9)
    for e in k.events:
        if e["cat"] == "cuda_runtime":
            e["name"] = "hipExtModuleLaunchKernel"
        if e["cat"] == "kernel":
            e["args"] = {
                "External id": 13,
                "device": 2,
                "stream": 0,
                "kind": "Dispatch Kernel",
                "correlation": e["args"]["correlation"],
            }
    doc = k.doc()
    doc["deviceProperties"] = [{"id": 2, "name": "AMD Instinct MI250X", "totalGlobalMem": 68702699520}]
    path = tmp_path / "rocm.json"
    path.write_text(json.dumps(doc))  # compact, as some ROCm builds write it
    _, header, frames = import_file(str(path))
    assert list(frames["kernel"]["kind"].astype(str)) == ["comm", "compute"]
    c = frames["comm"]
    assert list(c["op"].astype(str)) == ["all_reduce"] and c["bytes"].iloc[0] == 512
    assert "problems" not in header
