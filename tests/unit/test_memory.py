"""Per-step memory records: process RSS on CPU, and the CUDA path through a fake allocator behind
the device seam, `diag.collectors.device` (the real one is checked on a GPU machine)."""

from __future__ import annotations

from typing import Any

import psutil
import pytest
import torch
from diag.collectors import device

import diag
from diag import agent

GiB = 2**30


class FakeAllocator:
    """torch.cuda's caching allocator as memory_stats reports it, on an H200 (143771 MiB): weights and
    optimizer state stay allocated, each step's activations come and go, reserved rounds to 2 MiB."""

    def __init__(self, index: int = 3) -> None:
        self.index = index
        self.allocated = 18 * GiB
        self.peak = self.allocated
        self.reserved = self.allocated
        self.calls: dict[str, int] = {}

    def run_step(self, activations: int) -> None:
        self.peak = max(self.peak, self.allocated + activations)
        self.reserved = max(self.reserved, -(-(self.allocated + activations) // 2**21) * 2**21)
        self.allocated += 4096  # a little state that stays

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def ready(self) -> bool:
        return True

    def current_device(self) -> int:
        return self.index

    def memory_stats(self, device: int) -> dict[str, Any]:
        self._count("memory_stats")
        assert device == self.index
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self.peak,
            "reserved_bytes.all.current": self.reserved,
            "num_alloc_retries": 0,
        }

    def total_memory(self, device: int) -> int:
        self._count("total_memory")
        return 143771 * 2**20

    def device_name(self, device: int) -> str:
        return "NVIDIA H200"

    def reset_peak(self, device: int) -> None:
        self._count("reset_peak")
        self.peak = self.allocated


ACTIVATIONS = [9 * GiB, 30 * GiB, 12 * GiB, 41 * GiB, 5 * GiB]


def _train(fake: FakeAllocator | None = None) -> list[tuple[int, int, int]]:
    """Real torch steps; the fake allocator 'runs' each step. Returns (allocated, reserved, peak)
    as the allocator stands at each boundary, before any reset."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for act in ACTIVATIONS:
        model(torch.randn(3, 4)).sum().backward()
        if fake is not None:
            fake.run_step(act)
            seen.append((fake.allocated, fake.reserved, fake.peak))
        opt.step()
    return seen


@pytest.fixture
def fake(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)  # plain torch steps
    f = FakeAllocator()
    old = device.use(f)
    yield f
    device.use(old)


def test_cpu_rss_and_host_capacity(tmp_path, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)
    assert not device.backend.ready()  # no GPU here, and the agent never initializes CUDA itself
    agent.start(str(tmp_path), what=("memory",))
    _train()
    rss_now = psutil.Process().memory_info().rss
    agent.stop()
    mem = diag.load(str(tmp_path)).memory
    assert list(mem["step"]) == list(range(len(ACTIVATIONS)))
    assert (mem["device"] == "cpu").all() and mem["allocated"].isna().all()
    assert (mem["capacity"] == psutil.virtual_memory().total).all()
    assert abs(mem["rss"].iloc[-1] - rss_now) < 0.1 * rss_now  # /proc/self/statm read right


def test_cuda_running_peak_without_reset(tmp_path, fake):
    agent.start(str(tmp_path), what=("memory",))
    seen = _train(fake)
    agent.stop()
    tr = diag.load(str(tmp_path))
    mem = tr.memory
    got = list(zip(mem["allocated"], mem["reserved"], mem["peak"]))
    assert got == seen and (mem["device"] == "cuda:3").all()
    assert (mem["capacity"] == 143771 * 2**20).all() and (mem["rss"] > 0).all()
    assert fake.calls == {"memory_stats": len(ACTIVATIONS), "total_memory": 1}  # never reset
    assert tr.headers[tr.ranks[0]].get("memory_peak") == "running"
    assert tr.layout()["device_name"] == "NVIDIA H200"  # what MFU's peak table matches
    # the step that set a new running peak is the one whose activations were the largest so far
    rose = [s for s, (a, b) in enumerate(zip([0, *mem["peak"]], mem["peak"])) if b > a]
    assert rose == [0, 1, 3]


def test_cuda_per_step_peak_with_reset_option(tmp_path, fake):
    agent.start(str(tmp_path), what=("memory",), memory_reset_peak=True)
    _train(fake)
    agent.stop()
    tr = diag.load(str(tmp_path))
    base = 18 * GiB
    expected = [base + 4096 * i + act for i, act in enumerate(ACTIVATIONS)]
    assert list(tr.memory["peak"]) == expected  # each step's own peak
    assert fake.calls["reset_peak"] == len(ACTIVATIONS)
    assert tr.headers[tr.ranks[0]].get("memory_peak") == "per_step"


def test_memory_faults_are_counted(tmp_path, fake):
    ag = agent.start(str(tmp_path), what=("memory",), faults={"memory": "raise"})
    _train(fake)
    errors = dict(ag.errors)
    agent.stop()
    assert errors == {("memory", "step", "InjectedFault"): len(ACTIVATIONS)}
    assert len(diag.load(str(tmp_path)).steps) == len(ACTIVATIONS)


def test_rss_is_each_steps_own_on_fast_steps(tmp_path, monkeypatch):
    """memory_growth judges RSS step by step (>= 90% of increments rising): each record must hold the
    RSS at its own boundary. Read once per writer flush instead (a cheaper hook), steps shorter than
    the 0.2 s flush shared one value and the fault matrix's leak cell went unseen."""
    import itertools
    import sys

    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)
    agent.start(str(tmp_path), what=("memory",))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for _ in range(8):  # each step keeps 16 MiB more, in well under a flush interval
        kept.append(bytearray(16 << 20))
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    agent.stop()
    rss = list(diag.load(str(tmp_path)).memory["rss"])
    assert all(b - a >= 15 << 20 for a, b in itertools.pairwise(rss[1:])), rss
