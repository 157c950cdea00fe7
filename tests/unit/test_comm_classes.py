"""One communication classifier for Kineto kernels and host ops: NCCL, RCCL, DeepEP / NVSHMEM,
all-to-all and send/recv, extensible by the user; sizes nothing recorded stay unknown."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pandas as pd
import pytest

from diag.importers.kineto import import_file
from diag.importers.kineto_names import classify_kernels
from diag.vocab import COMM_PATTERN_ENV, COMPUTE, UNKNOWN_OP, host_comm_op, kernel_op
from tests.unit.kineto_samples import ROOT
from tests.unit.kineto_synth import Kineto

DEEPEP = [
    "void deep_ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*)",
    "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 2>(int4*)",
    "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int)",
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int)",
    "void deep_ep::internode_ll::dispatch<3, 7168>(void*, float*)",
]


def _deepseek_like(path, extra_kernel: str | None = None) -> str:
    """DualPipe's shape: a DeepEP kernel per micro-batch overlapped by a GEMM on another stream;
    an NCCL all_reduce (with its record_param_comms) before them."""
    k = Kineto(rank=0, world=64)
    k.step(1, 0, 1000)
    k.step(2, 1000, 1000)
    k.host(
        "record_param_comms",
        10,
        20,
        {
            "Collective name": "allreduce",
            "In msg nelems": 1024,
            "Out msg nelems": 1024,
            "dtype": "Float",
            "Group size": 64,
        },
    )
    k.kernel(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        40,
        20,
        launch=15,
        stream=20,
    )
    for i, name in enumerate(DEEPEP + ([extra_kernel] if extra_kernel else [])):
        t = 100 + 150 * i
        k.kernel(name, t, 100, launch=t - 30, stream=21)
        k.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t + 10, 80, launch=t - 20, stream=7)
    k.kernel("void at::native::vectorized_elementwise_kernel<4>()", 1100, 10, launch=1050)
    return k.write(path)


@pytest.mark.parametrize("name", DEEPEP)
def test_deepep_kernels_are_all_to_all_communication(name):
    kind = classify_kernels(pd.Series([name]), pd.Series(["kernel"]))
    assert kind.iloc[0] == "comm" and kernel_op(name) == "all_to_all"


def test_not_communication_and_nccl_names():
    names = [
        "sm90_xmma_gemm_bf16",
        "void dispatch_kernel<float>()",
        "internode_copy",
        "ncclx_helper",
        "ncclDevKernel_Generic(ncclDevComm*)",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
    ]
    kinds = list(classify_kernels(pd.Series(names), pd.Series(["kernel"] * len(names))))
    assert kinds == [COMPUTE, COMPUTE, COMPUTE, COMPUTE, "comm", "comm"]
    assert kernel_op(names[4]) == UNKNOWN_OP and kernel_op(names[5]) == "send_recv"
    assert kernel_op("ncclDevKernel_AllGather_RING_LL") == "all_gather"
    assert host_comm_op("c10d::alltoall_base_") == "all_to_all"
    assert host_comm_op("nccl:all_to_all") == "all_to_all"
    assert host_comm_op("aten::mm") is None and host_comm_op("c10d::frobnicate") is None


def test_deepep_trace_comm_frame_sizes_unknown(tmp_path):
    _, _, frames = import_file(_deepseek_like(tmp_path / "t.json"))
    c = frames["comm"]
    assert list(c["op"].astype(str)) == ["all_reduce"] + ["all_to_all"] * len(DEEPEP)
    assert c["bytes"].iloc[0] == 4096 and c["bytes"].iloc[1:].isna().all()  # unknown, not 0
    assert c["busbw"].iloc[1:].isna().all() and c["busbw"].iloc[0] > 0


def _torchrec(path, with_rpc_name: bool) -> str:
    """torchrec's all_to_all: NCCL runs it as a SendRecv kernel inside c10d::alltoall_base_."""
    k = Kineto(rank=0, world=8)
    k.step(1, 0, 1000)
    k.step(2, 1000, 1000)
    for t0 in (0, 1000):
        k.host("c10d::alltoall_base_", t0 + 100, 60)
        k.host("nccl:all_to_all", t0 + 105, 50, {"Input Dims": [[4096]]}, cat="user_annotation")
        rpc = {"Collective name": "all_to_allv"} if with_rpc_name else {}
        k.host("record_param_comms", t0 + 110, 40, rpc)
        k.kernel(
            "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
            t0 + 200,
            100,
            launch=t0 + 120,
            stream=30,
        )
        k.host("c10d::allreduce_", t0 + 400, 20)
        k.host("record_param_comms", t0 + 402, 15, {"Collective name": "allreduce"})
        k.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 450, 100, launch=t0 + 405, stream=30)
    return k.write(path)


@pytest.mark.parametrize("with_rpc_name", [True, False])
def test_torchrec_all_to_all_is_not_send_recv(tmp_path, with_rpc_name):
    _, _, frames = import_file(_torchrec(tmp_path / "t.json", with_rpc_name))
    assert list(frames["comm"]["op"].astype(str)) == ["all_to_all", "all_reduce"] * 2


def _analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k != COMM_PATTERN_ENV}
    e.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "diag", "analyze", *args], capture_output=True, text=True, env=e, timeout=120
    )


def test_deepep_overlap_and_unknown_sizes_in_the_report(tmp_path):
    path = _deepseek_like(tmp_path / "t.json")
    r = _analyze(path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (ov,) = doc["metrics"]["overlap"]
    assert ov["overlap_pct"] > 75  # 80 of each 100 us DeepEP kernel under a GEMM; the all_reduce bare
    a2a = next(r for r in doc["metrics"]["collectives"] if r["op"] == "all_to_all")
    assert a2a["calls"] == len(DEEPEP) and a2a["mean_bytes"] is None and a2a["busbw"] is None
    text = _analyze(path).stdout
    row = next(line for line in text.splitlines() if "all_to_all" in line)
    assert "0 B" not in row and "0.000" not in row and "-" in row


def test_user_pattern_from_option_and_environment(tmp_path):
    path = _deepseek_like(tmp_path / "t.json", extra_kernel="void my_lib::ring_exchange<4>(float*)")

    def calls(r: subprocess.CompletedProcess[str]) -> int:
        assert r.returncode == 0, r.stderr
        return sum(c["calls"] for c in json.loads(r.stdout)["metrics"]["collectives"])

    base = calls(_analyze(path, "--json"))
    assert calls(_analyze(path, "--json", "--comm-pattern", r"my_lib::ring_\w+")) == base + 1
    assert calls(_analyze(path, "--json", env={COMM_PATTERN_ENV: "ring_exchange"})) == base + 1
    bad = _analyze(path, "--comm-pattern", "ring(")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "ring(" in bad.stderr


def test_tiny_collectives_silent_without_sizes(tmp_path):
    """64 unsized DeepEP kernels a step: the premise (sizes under 64 KiB) is not measured."""
    k = Kineto(rank=0, world=8)
    for s in range(4):
        k.step(s, s * 10000, 10000)
        for i in range(64):
            t = s * 10000 + 100 + i * 150
            k.kernel(DEEPEP[0], t, 100, launch=t - 10)
    r = _analyze(k.write(tmp_path / "t.json"), "--json")
    doc = json.loads(r.stdout)
    assert [f["rule"] for f in doc["findings"] if f["rule"] == "tiny_collectives"] == []
    assert all(
        math.isnan(x) if isinstance(x, float) else x is None
        for x in [c["busbw"] for c in doc["metrics"]["collectives"]]
    )


def test_zero3_slow_link_silent_when_sizes_unknown(tmp_path):
    """Its premise is a bandwidth: collectives without a recorded size measure none (a NaN busbw
    compared false against the link and fired before)."""
    from tests.unit.synth_trace import Job, fired

    job = Job(header={"zero_stage": 3, "dtype": "fp16"}, hosts=["a", "b"])
    job.each_step(
        lambda r, s: [
            job.comm(r, s, op="all_gather_into_tensor", nbytes=None, at_ms=10 * i, dur_ms=15)
            for i in range(4)
        ]
    )
    assert fired(job.write(str(tmp_path)), "zero3_slow_link") == []
