"""Kineto import on real torch.profiler traces: rank, steps, kernels, collectives (gloo and NCCL)."""

from __future__ import annotations

import collections
import gzip
import json
import os
import shutil
from math import prod

import pandas as pd
import pytest

from diag.importers.kineto import import_file
from diag.importers.kineto_names import classify_kernels
from diag.vocab import canonical_op
from tests.unit.kineto_samples import CPU_RANKS, GPT_DS, GPU_RANKS, raw_events


def test_gloo_trace_rank_steps_and_collectives():
    rank, header, frames = import_file(CPU_RANKS[1])
    raw = raw_events(CPU_RANKS[1])
    assert rank == 1 and header["world_size"] == 2 and header["backend"] == "gloo"
    want_steps = sorted(int(e["name"].split("#")[1]) for e in raw if e["name"].startswith("ProfilerStep#"))
    assert list(frames["step"]["step"]) == want_steps
    gloo = [e for e in raw if e.get("name", "").startswith("gloo:")]
    comms = frames["comm"]
    assert collections.Counter(comms["op"].astype(str)) == collections.Counter(
        canonical_op(e["name"]) for e in gloo
    )
    assert len(gloo) == sum(e.get("name", "").startswith("c10d::") for e in raw)  # each op ran once
    first_ag = next(e for e in gloo if e["name"] == "gloo:all_gather")
    row = comms[comms["op"] == "all_gather"].iloc[0]
    assert row["bytes"] == prod(first_ag["args"]["Input Dims"][0]) * 4 * 2  # fp32, gathered from 2
    assert row["dur"] == round(first_ag["dur"] * 1000)
    assert frames["kernel"].empty and (comms["step"] >= 1).all()


def test_fp16_sizes_and_rank_from_distributed_info(tmp_path):
    src = os.path.join(GPT_DS, "rank1.pt.trace.json.gz")
    renamed = tmp_path / "trace.json.gz"
    shutil.copy(src, renamed)
    rank, _, frames = import_file(str(renamed))
    assert rank == 1  # from distributedInfo, not the file name
    sizes = {"c10::Half": 2, "unsigned char": 1}  # fp16 gradients and DeepSpeed's overflow flag
    want = sorted(
        prod(e["args"]["Input Dims"][0]) * sizes[e["args"]["Input type"][0]]
        for e in raw_events(src)
        if e.get("name") == "gloo:all_reduce"
    )
    assert sorted(frames["comm"]["bytes"]) == want


@pytest.mark.parametrize("path,prefix", [(GPU_RANKS[0], "ncclDevKernel_"), (GPU_RANKS[1], "ncclKernel_")])
def test_gpu_trace_nccl_kernels_and_param_comms(path, prefix):
    _, _, frames = import_file(path)
    raw = raw_events(path)
    k = frames["kernel"]
    comm = k[k["kind"] == "comm"]
    assert len(comm) and comm["name"].astype(str).str.startswith(prefix).all()
    rpc = [e for e in raw if e.get("name") == "record_param_comms"]
    assert len(frames["comm"]) == len(comm) == len(rpc)
    assert list(frames["comm"]["op"].astype(str)) == [
        canonical_op(e["args"]["Collective name"]) for e in sorted(rpc, key=lambda e: e["ts"])
    ]
    assert set(k.loc[k["name"].astype(str).str.startswith(("Memcpy", "Memset")), "kind"]) == {"memory"}
    assert (k.loc[k["launch_ts"] >= 0, "step"] >= 0).all()


def test_kernel_classes_case_insensitive():
    names = [
        "ncclKernel_AllReduce_RING_LL_Sum_float",
        "ncclDevKernel_AllGather_RING_LL",
        "NCCLDEVKERNEL_ReduceScatter_Sum_bf16",
        "Memcpy DtoH (Device -> Pinned)",
        "Memset (Device)",
        "dma_copy",
        "ampere_bf16_s16816gemm",
        "cudaStreamSync_x",
    ]
    got = classify_kernels(pd.Series(names), pd.Series(["kernel"] * len(names)))
    assert list(got) == ["comm", "comm", "comm", "memory", "memory", "memory", "compute", "other"]


@pytest.mark.parametrize(
    "name,op",
    [
        ("c10d::_allgather_base_", "all_gather"),
        ("c10d::allreduce_", "all_reduce"),
        ("gloo:reduce_scatter", "reduce_scatter"),
        ("all_gather_into_tensor", "all_gather"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("ncclDevKernel_Broadcast_RING_LL", "broadcast"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("nccl:all_reduce", "all_reduce"),
    ],
)
def test_canonical_op_names(name, op):
    assert canonical_op(name) == op


def test_chunked_parse_equals_whole_parse(tmp_path, monkeypatch):
    from diag.importers import kineto_events

    src = os.path.join(GPT_DS, "rank0.pt.trace.json.gz")
    assert kineto_events._split(gzip.open(src).read()) is not None  # torch's pretty format
    monkeypatch.setattr(kineto_events, "CHUNK", 50_000)  # many chunks
    _, _, chunked = import_file(src)
    compact = tmp_path / "rank0.json"
    compact.write_text(json.dumps(json.load(gzip.open(src))))  # one line: parsed whole
    assert kineto_events._split(compact.read_bytes()) is None
    _, _, whole = import_file(str(compact))
    for kind in ("step", "cpu_op", "comm", "kernel"):
        pd.testing.assert_frame_equal(
            chunked[kind].reset_index(drop=True), whole[kind].reset_index(drop=True)
        )
    assert len(chunked["cpu_op"]) > 1000


def test_worker_processes_give_the_same_frames(monkeypatch, tmp_path):
    from diag.importers import load_inputs, parallel

    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    paths = [*(os.path.join(GPT_DS, f"rank{r}.pt.trace.json.gz") for r in (0, 1)), str(bad)]
    serial = load_inputs(paths)
    monkeypatch.setattr(parallel, "workers_for", lambda p: 2)
    forked = load_inputs(paths)
    assert [str(p) for p in forked.problems] == [str(p) for p in serial.problems] and serial.problems
    for kind, df in serial.frames.items():
        pd.testing.assert_frame_equal(forked.frames[kind], df)
