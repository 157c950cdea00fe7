# ruff: noqa: E731, B023  (benchmark closures run inside the loop iteration that defines them)
"""Cost of the module tracker and the layers collector, side by side in one run (prints ratios).

1. per module call on non-sampled steps: many small Linear layers, forward+backward with the agent
   (layers_every huge: never sampled after the first) vs without, divided by module calls.
2. sampled step: a small transformer fwd+bwd, plain vs our collector (layers_every=1) counting
   FLOPs on every step (flops_every=1, like FlopCounterMode) and with the default reuse
   (flops_every=4: same shapes, counted 1 step in 4) vs torch.utils.flop_counter.FlopCounterMode.
"""

import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from torch.utils.flop_counter import FlopCounterMode

from diag import agent as A

torch.set_num_threads(1)


def timeit(fn, n):
    fn()
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)  # the least-disturbed run: the machine is shared


def mlp_step(model, x):
    model(x).sum().backward()


def per_call():
    n_layers = 200
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(n_layers)])
    x = torch.randn(2, 8, requires_grad=True)
    calls = n_layers + 1
    res = {"base": [], "on": [], "base_ng": [], "on_ng": []}
    for _ in range(5):  # interleave: the machine is shared and noisy
        res["base"].append(timeit(lambda: mlp_step(model, x), 15))
        with torch.no_grad():
            res["base_ng"].append(timeit(lambda: model(x), 15))
        ag = A.start(tempfile.mkdtemp(), what=("layers",), layers_every=10**9)
        ag.begin_step(1)  # a non-sampled step
        res["on"].append(timeit(lambda: mlp_step(model, x), 15))
        with torch.no_grad():
            res["on_ng"].append(timeit(lambda: model(x), 15))
        A.stop()
    base, on, base_ng, on_ng = (min(res[k]) for k in ("base", "on", "base_ng", "on_ng"))
    print(
        f"non-sampled, fwd+bwd: {(on - base) / calls * 1e6:.2f} us per module call "
        f"(step {base * 1e3:.2f} -> {on * 1e3:.2f} ms)"
    )
    print(
        f"non-sampled, fwd under no_grad: {(on_ng - base_ng) / calls * 1e6:.2f} us per module call "
        f"({base_ng * 1e3:.2f} -> {on_ng * 1e3:.2f} ms)"
    )


class Tiny(torch.nn.Module):
    def __init__(self, vocab=128, d=64, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def sampled():
    torch.manual_seed(0)
    model = Tiny()
    ids = torch.randint(0, 128, (8, 64))
    step = lambda: model(ids).float().pow(2).mean().backward()

    def fcm():
        with FlopCounterMode(display=False):
            step()

    res = {"base": [], "fcm": [], "counting": [], "ours": [], "unsampled": []}
    for _ in range(4):  # interleaved rounds, min of each: the machine is shared
        res["base"].append(timeit(step, 8))
        res["fcm"].append(timeit(fcm, 8))
        i = [0]

        def ours():
            ag.begin_step(i[0])
            i[0] += 1
            step()

        ag = A.start(tempfile.mkdtemp(), what=("layers",), layers_every=1, flops_every=1)
        res["counting"].append(timeit(ours, 8))
        A.stop()
        ag = A.start(tempfile.mkdtemp(), what=("layers",), layers_every=1)
        res["ours"].append(timeit(ours, 8))
        ag.layers_every = 10**9

        def off():
            ag.begin_step(1)
            step()

        res["unsampled"].append(timeit(off, 8))
        A.stop()
    base, flop, counting, mine, unsampled = (
        min(res[k]) for k in ("base", "fcm", "counting", "ours", "unsampled")
    )
    print(
        f"small transformer step {base * 1e3:.1f} ms: sampled (ours, counting) x{counting / base:.2f}, "
        f"sampled (ours, FLOPs reused 3 steps in 4) x{mine / base:.2f}, "
        f"FlopCounterMode x{flop / base:.2f}, non-sampled (ours) x{unsampled / base:.3f}"
    )


per_call()
sampled()
