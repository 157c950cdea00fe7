"""launch_bound: kernels shorter than their launch calls and a GPU idling for the host are flagged;
a GPU kept busy by long, queued kernels is not, nor one that only waits between steps."""

from __future__ import annotations

from diag.importers import load_inputs
from diag.metrics.stage import Metrics
from tests.unit.kineto_synth import Kineto
from tests.unit.synth_trace import fired


def _job(
    path,
    kernel_us: float,
    launch_us: float,
    queued: bool,
    steps: int = 4,
    per_step: int = 60,
    step_gap_us: float = 0.0,
) -> str:
    """`per_step` kernels a step. Queued: the host runs ahead, every kernel waits for the previous
    one. Not queued: each kernel starts when its launch call returns."""
    k = Kineto(rank=0, world=1)
    t = 0.0
    for s in range(steps):
        t += step_gap_us
        start = t
        gpu_free = t
        for i in range(per_step):
            launch = start + i * (launch_us + 1) if queued else t
            ts = max(gpu_free, launch + launch_us + 1)
            k.kernel(
                f"void small_kernel_{i % 7}<float>()", ts, kernel_us, launch=launch, launch_dur=launch_us
            )
            gpu_free = ts + kernel_us
            t = launch + launch_us + 1 if not queued else max(t, gpu_free)
        t = max(t, gpu_free)
        k.step(s, start, t - start)
    return k.write(path)


def test_short_kernels_waiting_on_launches_are_flagged(tmp_path):
    trace = load_inputs([_job(tmp_path / "t.json", kernel_us=4, launch_us=10, queued=False)])
    (f,) = fired(trace, "launch_bound")
    assert f.ranks == [0] and f.evidence["short_kernel_share"] == 1.0
    assert f.evidence["host_wait_share"][0] > 0.5 and f.recoverable_s > 0
    assert "CUDA graphs" in f.fixes[0].summary


def test_long_queued_kernels_are_not(tmp_path):
    trace = load_inputs([_job(tmp_path / "t.json", kernel_us=200, launch_us=10, queued=True)])
    assert fired(trace, "launch_bound") == []


def test_idle_between_steps_alone_is_not(tmp_path):
    """Kernels queued ahead by the host, then a long data-loader gap before each step."""
    path = _job(tmp_path / "t.json", kernel_us=30, launch_us=10, queued=True, step_gap_us=5000)
    trace = load_inputs([path])
    assert fired(trace, "launch_bound") == []
    assert Metrics(trace).breakdown["idle_pct"].iloc[0] > 30  # idle, but not waiting for launches


def _loader_job(path, loader: bool) -> str:
    """Each step two micro-batches (gradient accumulation), each a 12 ms DataLoader fetch (or the host
    busy as long, with no fetch op), then one 2 ms kernel and 60 short ones launched while it runs
    (queued: no kernel waits for its launch; the short ones, 4 us, are shorter than their launches,
    10 us). The host fetches the next batch once it has launched them: the GPU idles for the fetch
    inside the step (the first micro-batch's is a gap between steps, left out either way)."""
    k = Kineto(rank=0, world=1)
    t = 0.0
    gpu_free = 0.0
    for s in range(6):
        start = t
        for _ in range(2):
            if loader:
                k.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 12000)
            launch = t + 12000
            gpu_free = max(launch + 12, gpu_free)
            k.kernel("void big_gemm<float>()", gpu_free, 2000, launch=launch, launch_dur=10)
            gpu_free += 2000
            for i in range(60):
                k.kernel(
                    f"void small_kernel_{i % 7}<float>()",
                    gpu_free,
                    4,
                    launch=launch + 11 * (i + 1),
                    launch_dur=10,
                )
                gpu_free += 4
            t = launch + 11 * 61
        k.step(s, start, t - start)
    return k.write(path)


def test_a_dataloader_fetch_is_no_wait_for_launches(tmp_path):
    """The GPU's idle time inside each step is the fetch: input (idle_between_steps names it), not
    launches; the same gap with no fetch op stays the host's (launch_bound)."""
    trace = load_inputs([_loader_job(tmp_path / "t.json", loader=True)])
    assert fired(trace, "launch_bound") == []
    (f,) = fired(trace, "idle_between_steps")
    assert "DataLoader" in f.title
    plain = load_inputs([_loader_job(tmp_path / "p.json", loader=False)])
    assert [f.rule for f in fired(plain, "launch_bound")] == ["launch_bound"]
