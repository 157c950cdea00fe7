"""A profiled step that waits for its batch (the PyTorch TensorBoard tutorial's case: ResNet-50 with
num_workers=0, its GPU idle 39% of each step inside `enumerate(DataLoader)#...__next__`): the fetch is
inside the Kineto step, so idle_between_steps reads the loader's ops with no kernel running.

Real torch.profiler traces of a CPU job whose Dataset is slow or fast, and small GPU-shaped traces
for what a CPU host cannot make: kernels still running while the host loads."""

from __future__ import annotations

import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, Dataset

from diag.importers import load_inputs
from diag.metrics import input_wait
from diag.metrics.stage import Metrics
from tests.unit.kineto_synth import Kineto
from tests.unit.synth_trace import fired

SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


class Slow(Dataset):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return torch.randn(32)


def _profiled(tmp_path, sleep_s: float) -> str:
    """Eight profiled steps of a small MLP fed by a num_workers=0 DataLoader (batches of 4)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(sleep_s), batch_size=4, num_workers=0)
    path = str(tmp_path / "rank0.json")
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=8),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    ) as prof:
        for i, x in enumerate(loader):
            if i == 9:
                break
            for _ in range(20):  # a few ms of compute a step
                loss = model(x).square().mean()
                loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return path


@pytest.mark.parametrize("sleep_s, fires", [(0.01, True), (0.0, False)])
def test_a_real_profiled_job_waiting_on_its_loader(tmp_path, sleep_s, fires):
    """4 items of 10 ms a batch: ~40 ms of each step in the loader, the compute a few ms."""
    trace = load_inputs([_profiled(tmp_path, sleep_s)])
    got = fired(trace, "idle_between_steps")
    if not fires:
        assert got == []
        return
    (f,) = got
    assert "waits for the DataLoader" in f.title and "num_workers=0" in f.detail, f
    assert 0.035 <= f.recoverable_s <= 0.08, f.recoverable_s  # 4 x 10 ms of sleep, and the fetch itself
    assert "num_workers=4" in f.fixes[0].summary


def _gpu(tmp_path, loader: str, load_us: float, busy_us: float, steps: int = 5) -> str:
    """Each 20 ms step: the fetch first (`load_us`, while the previous step's kernels still run for
    `busy_us`), then 100 us kernels back to back to the step's end."""
    k = Kineto(rank=0, world=1)
    step_us = 20_000.0
    for s in range(steps):
        t0 = s * step_us
        k.step(s, t0, step_us)
        k.host(loader, t0 + 1, load_us)
        ts = t0 + max(load_us, busy_us) + 2 if s else t0 + load_us + 2
        while ts + 100 <= t0 + step_us + busy_us and ts + 100 <= steps * step_us:
            k.kernel("void gemm_kernel<float>()", ts, 100, launch=max(t0 + load_us + 1, ts - 50))
            ts += 100
    return k.write(tmp_path / "gpu.json")


def test_kernels_still_running_while_the_host_loads_are_not_a_wait(tmp_path):
    """8 ms of fetch, the previous step's kernels running through its first 5.9 ms (the last 100 us
    kernel that fits before 6 ms): 2.1 ms a step idles, 11%: no finding."""
    trace = load_inputs([_gpu(tmp_path, SINGLE, load_us=8000, busy_us=6000)])
    g = Metrics(trace)
    from diag.metrics.idle import gaps

    waits = gaps(g)["loader_s"]
    assert ((waits - 0.0021).abs() < 1e-5).all(), waits.tolist()
    assert fired(trace, "idle_between_steps") == []


def test_workers_that_fall_behind_get_no_num_workers_4(tmp_path):
    """Waiting for loader workers (their count is not in the trace): the fix names no value."""
    trace = load_inputs([_gpu(tmp_path, MULTI, load_us=8000, busy_us=0)])
    (f,) = fired(trace, "idle_between_steps")
    assert "num_workers=0" not in f.detail and "num_workers=4" not in f.fixes[0].summary
    assert f.recoverable_s == pytest.approx(0.008, abs=3e-4)
    assert input_wait.single_process(trace.frame("cpu_op")) is False
