"""The layers collector on real training loops (the real steps collector drives the boundaries):
exact per-module FLOPs forward and backward, untouched numerics, sampling, faults, stop from another
thread, and the CUDA-event timing path through its seam with a fake event class."""

from __future__ import annotations

import argparse
import glob
import os
import sys
import threading
import time
from typing import Any

import pytest
import torch
from diag.collectors import device, layers
from torch.utils._python_dispatch import _len_torch_dispatch_stack
from torch.utils.flop_counter import FlopCounterMode

from diag import agent as diag_agent
from diag import schema
from diag.trace.reader import read_file
from tests.integration import truth
from tests.unit.fake_device import FakeDevice, installed

# plain torch loops, numbered by the steps collector: independent of a DeepSpeed other test files load
pytestmark = pytest.mark.usefixtures("without_deepspeed")


class Tiny(torch.nn.Module):
    """Embedding, one transformer encoder layer (SDPA inside), a head: a small real transformer."""

    def __init__(self, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.block = torch.nn.TransformerEncoderLayer(d, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(ids)))


def train(steps: int, pause: Any = None) -> list[float]:
    """A plain torch loop (Adam): the steps collector hooks the optimizer step."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 32, (4, 8))
    losses = []
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        if pause is not None:
            pause(step)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def events(trace_dir: str, kind: str) -> list[dict[str, Any]]:
    out = []
    for path in glob.glob(os.path.join(trace_dir, "*.jsonl")):
        out.extend(e for e in read_file(path)[1] if e["k"] == kind)
    return out


def _three_steps_recorded(model: torch.nn.Module, trace: str) -> list[dict]:
    """Train `model` 3 SGD steps on (4, 8) inputs with the layers collector on every step; its records."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    diag_agent.start(trace, what=("layers",), layers_every=1)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    diag_agent.stop()
    return events(trace, schema.LAYER)


def test_numerics_unchanged_and_every_step_recorded(tmp_path) -> None:
    reference = train(3)
    diag_agent.start(str(tmp_path), what=("layers",), layers_every=1)
    observed = train(3)
    diag_agent.stop()
    assert observed == reference  # bit-identical
    recs = events(str(tmp_path), schema.LAYER)
    assert {r["step"] for r in recs} == {0, 1, 2}
    names = {r["module"] for r in recs}
    assert {"Tiny", "embed", "block", "block.self_attn", "block.linear1", "head"} <= names
    embed = [r for r in recs if r["module"] == "embed"]
    assert {r["phase"] for r in embed} == {"fwd", "bwd"} and all(r["flops"] == 0 for r in embed)
    assert all(r["dur"] >= 0 and r["mem_delta"] is None for r in recs)


def test_module_flops_exact_and_inclusive(tmp_path) -> None:
    m, k, n, p = 6, 8, 16, 4
    model = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.ReLU(), torch.nn.Linear(n, p))
    ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=1)
    ag.begin_step(0)
    model(torch.randn(m, k)).sum().backward()
    diag_agent.stop()
    got = {(r["module"], r["phase"]): r["flops"] for r in events(str(tmp_path), schema.LAYER)}
    first, second = 2 * m * k * n, 2 * m * n * p
    assert got[("0", "fwd")] == first and got[("2", "fwd")] == second
    assert got[("1", "bwd")] == 0  # a parameter-less leaf (ReLU) is tracked on sampled steps
    assert got[("0", "bwd")] == first  # its input needs no grad: only the weight-gradient matmul
    assert got[("2", "bwd")] == 2 * second  # weight gradient + input gradient
    assert got[("Sequential", "fwd")] == first + second
    assert got[("Sequential", "bwd")] == first + 2 * second  # inclusive of its children


def test_sampling_every_n_steps(tmp_path) -> None:
    """Every 3rd step, and the first steady one (the third: the first has no duration, the second
    is the analysis's warm-up): a 12-step megatron-core run at the default 50 had step 0 alone,
    its first all_reduce 111.6 of the embedding's 115.7 ms forward."""
    diag_agent.start(str(tmp_path), what=("layers",), layers_every=3)
    train(7)
    diag_agent.stop()
    assert {r["step"] for r in events(str(tmp_path), schema.LAYER)} == {0, 2, 3, 6}
    assert len({r["step"] for r in events(str(tmp_path), schema.STEP)}) == 7


def test_layers_listens_to_step_boundaries_only_while_a_sample_runs(tmp_path) -> None:
    """An unsampled step has nothing for the layers recorder to end: its step listener leaves after a
    sample's boundary and is back once the next sample's forward begins (a call fewer per step)."""
    ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=3)
    listening = []
    train(7, pause=lambda step: listening.append(any(c == "layers" for c, _, _ in ag.step_listeners)))
    diag_agent.stop()
    assert listening == [True, False, True, True, False, False, True]
    assert {r["step"] for r in events(str(tmp_path), schema.LAYER)} == {0, 2, 3, 6}


def test_hook_faults_are_counted_not_raised(tmp_path) -> None:
    reference = train(2)
    ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=1, faults={"layers": "raise"})
    assert train(2) == reference
    status = ag.status()
    diag_agent.stop()
    assert status["errors"].get("layers", 0) > 0
    assert events(str(tmp_path), schema.LAYER) == []
    assert _len_torch_dispatch_stack() == 0


def test_stop_from_another_thread_mid_step(tmp_path) -> None:
    reference = train(4)
    ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=1, flops_every=1)
    stack_during: list[int] = []

    def pause(step: int) -> None:
        if step == 1:  # the FlopMode is pushed on this thread, between forward and backward
            stack_during.append(_len_torch_dispatch_stack())
            stopper = threading.Thread(target=diag_agent.stop, name="stopper")
            stopper.start()
            stopper.join()

    assert train(4, pause) == reference
    assert stack_during == [1]
    assert _len_torch_dispatch_stack() == 0  # popped by the training thread's next module call
    assert diag_agent.current() is None and ag.module_stack == []


def test_a_stop_from_another_thread_returns_once_the_job_is_as_before(tmp_path) -> None:
    """The control thread's stop() while the FlopMode is pushed on a running training thread waits
    for the training thread's next module call to pop it: when stop() returns, no hook of diag's is
    left (it used to return with the self-removing hook still on: `diag detach` had returned and
    the job was not yet as before)."""
    from torch.nn.modules import module as torch_module

    reference = train(4)
    base = len(torch_module._global_forward_pre_hooks)
    diag_agent.start(str(tmp_path), what=("layers",), layers_every=1, flops_every=1)
    after_stop: list[tuple[int, int]] = []
    stopper = threading.Thread(
        target=lambda: (
            diag_agent.stop(),
            after_stop.append((len(torch_module._global_forward_pre_hooks), _len_torch_dispatch_stack())),
        ),
        name="stopper",
    )

    def pause(step: int) -> None:
        if step == 1:  # the FlopMode is pushed on this thread; the stop's thread returns on its own
            stopper.start()
            time.sleep(0.3)

    assert train(4, pause) == reference
    stopper.join(10)
    assert after_stop == [(base, 0)]  # the dispatch stack is per thread: the stopper's own is empty
    assert len(torch_module._global_forward_pre_hooks) == base and _len_torch_dispatch_stack() == 0


def _steps_of(trace_dir: str) -> dict[int, dict[tuple[str, str], int]]:
    out: dict[int, dict[tuple[str, str], int]] = {}
    for r in events(trace_dir, schema.LAYER):
        out.setdefault(r["step"], {})[(r["module"], r["phase"])] = r["flops"]
    return out


def test_flops_counted_once_per_signature_then_reused(tmp_path) -> None:
    """flops_every=3: the FlopMode runs on the first sample of an input signature and every 3rd after
    it; the samples in between time every module, run no op through Python (empty dispatch stack)
    and carry the counted FLOPs. A new batch shape is counted at once, with its own FLOPs."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=1, flops_every=3)
    stacks = []
    probe = model[1].register_forward_hook(lambda *_: stacks.append(_len_torch_dispatch_stack()))
    batches = [6, 6, 6, 6, 12, 12, 6]
    for step, rows in enumerate(batches):
        ag.begin_step(step)
        model(torch.randn(rows, 8)).sum().backward()
    ag.begin_step(len(batches))
    probe.remove()
    diag_agent.stop()
    assert stacks == [1, 0, 0, 1, 1, 0, 0]  # counted: 6 first, 6 again 3 samples on, 12 first
    got = _steps_of(str(tmp_path))
    assert sorted(got) == list(range(len(batches)))
    for step, rows in enumerate(batches):
        first, second = 2 * rows * 8 * 16, 2 * rows * 16 * 4
        assert got[step][("0", "fwd")] == first and got[step][("2", "bwd")] == 2 * second
        assert got[step][("Sequential", "bwd")] == first + 2 * second
    meta = [r for r in events(str(tmp_path), schema.META) if r.get("key") == schema.META_FLOPS_EVERY]
    assert [r["value"] for r in meta] == [3]


def test_an_eval_forward_does_not_lend_its_flops_to_training_steps(tmp_path) -> None:
    """nanoGPT's loop: an eval forward under no_grad (same batch shape) opens the first sampled
    step, then training. The eval forward has no backward, so its counted FLOPs must not be reused
    for a training step's backward (it was: bwd FLOPs None, FLOPs/step a third of the truth), nor
    its times and FLOPs be the step's (step 0 had two forwards' FLOPs and one backward's)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=1, flops_every=4)
    for step in range(3):
        ag.begin_step(step)
        if step == 0:
            with torch.no_grad():
                model(torch.randn(6, 8))
        model(torch.randn(6, 8)).sum().backward()
    ag.begin_step(3)
    diag_agent.stop()
    got = _steps_of(str(tmp_path))
    first, second = 2 * 6 * 8 * 16, 2 * 6 * 16 * 4
    roots = [r["step"] for r in events(str(tmp_path), schema.LAYER) if r["module"] == "Sequential"]
    assert roots == [0, 0, 1, 1, 2, 2]  # one forward and one backward a step: no eval forward
    for step in (0, 1, 2):  # reused samples: the training forward's counts, backward included
        assert got[step][("Sequential", "fwd")] == first + second
        assert got[step][("Sequential", "bwd")] == first + 2 * second


def test_flops_every_one_counts_every_sample(tmp_path) -> None:
    model = torch.nn.Linear(4, 4)
    ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=1, flops_every=1)
    stacks = []
    probe = model.register_forward_hook(lambda *_: stacks.append(_len_torch_dispatch_stack()))
    for step in range(3):
        ag.begin_step(step)
        model(torch.randn(2, 4)).sum().backward()
    probe.remove()
    diag_agent.stop()
    assert stacks == [1, 1, 1]


class FakeEvent:
    """Stands for torch.cuda.Event: a fake clock in ms, completion controlled by the test."""

    clock = 0.0
    done = False

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t = -1.0

    def record(self, stream: Any = None) -> None:
        FakeEvent.clock += 1.5
        self.t = FakeEvent.clock

    def query(self) -> bool:
        return FakeEvent.done

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.t - self.t


def test_cuda_event_path_through_the_seam(tmp_path) -> None:
    ag = diag_agent.start(str(tmp_path), what=("steps",), layers_every=1)
    allocated = iter(range(0, 10**9, 1024))
    with installed(FakeDevice(FakeEvent, lambda: next(allocated))):
        layers.install(ag, ag.undo)
        lin = torch.nn.Linear(4, 4)
        ag.begin_step(0)
        lin(torch.randn(2, 4)).sum().backward()
    assert isinstance(ag.state.get(layers.LayerRecorder).timer, device.CudaTimer)
    ag.flush()
    time.sleep(0.5)  # the writer holds the records back: the end events have not completed
    assert events(str(tmp_path), schema.LAYER) == []
    FakeEvent.done = True
    diag_agent.stop()
    recs = events(str(tmp_path), schema.LAYER)
    assert {(r["module"], r["phase"]) for r in recs} == {("Linear", "fwd"), ("Linear", "bwd")}
    assert all(r["dur"] == 1_500_000 and r["mem_delta"] == 1024 for r in recs)


@pytest.fixture
def megatron_tp1(tmp_path):
    """A tiny megatron-core GPTModel, TP=1 in this process (gloo, world size 1), torch.cuda shimmed."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    from megatron.core import parallel_state

    from tests.workloads import shims
    from tests.workloads.megatron_tp import build_model

    touched = (
        "current_device",
        "synchronize",
        "get_rng_state",
        "set_rng_state",
        "manual_seed",
        "manual_seed_all",
    )
    saved = {name: getattr(torch.cuda, name) for name in touched}
    shims.megatron_cpu()
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    args = argparse.Namespace(tp=1, pp=1, seed=0, layers=1, hidden=32, heads=4, vocab=64, seq=16, batch=2)
    try:
        yield build_model(args), args
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)


def test_megatron_gpt_names_and_flops(tmp_path, megatron_tp1) -> None:
    model, a = megatron_tp1
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
    pos = torch.arange(a.seq).unsqueeze(0).expand(a.batch, -1)
    mask = torch.tril(torch.ones(1, 1, a.seq, a.seq)) < 0.5

    def step() -> None:
        model(tokens, pos, mask, labels=tokens).mean().backward()

    trace = tmp_path / "trace"
    ag = diag_agent.start(str(trace), what=("layers",), layers_every=1)
    ag.begin_step(0)
    step()
    diag_agent.stop()
    with FlopCounterMode(display=False) as reference:
        step()
    got = {(r["module"], r["phase"]): r["flops"] for r in events(str(trace), schema.LAYER)}
    qkv, tokens_n = "decoder.layers.0.self_attention.linear_qkv", a.batch * a.seq
    assert got[(qkv, "fwd")] == 2 * tokens_n * a.hidden * 3 * a.hidden
    assert got[(qkv, "bwd")] == 2 * got[(qkv, "fwd")]
    head_dim = a.hidden // a.heads
    core = "decoder.layers.0.self_attention.core_attention"
    assert got[(core, "fwd")] == 4 * a.batch * a.heads * a.seq * a.seq * head_dim  # baddbmm + bmm
    # everything counted once: the root's forward + backward is torch's total
    assert got[("GPTModel", "fwd")] + got[("GPTModel", "bwd")] == reference.get_total_flops()
    # Megatron's IdentityOp placeholders do no work (torch's counter gives them backward FLOPs)
    for name in ("pre_cross_attn_layernorm", "cross_attention", "self_attention.q_layernorm"):
        assert got.get((f"decoder.layers.0.{name}", "bwd"), 0) == 0
    # the Softmax megatron builds on every call is named after its caller
    assert (f"{core}.scale_mask_softmax.Softmax", "fwd") in got


def test_windows_nest_after_an_attach_inside_a_forward(tmp_path) -> None:
    """Issue 9: a parent's window took in its next sibling's (`layers.0` forward ended when layer 1
    ended), the root was missing. An attach lands mid-forward: hooks start inside a module whose
    pre-hook never ran; its post-hook must not close (pop) another module's window."""
    trace = str(tmp_path / "trace")
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inner = model[1]

    def attach_here(_mod: Any, _args: Any) -> None:
        diag_agent.start(trace, what=("layers",), layers_every=1)

    handle = inner[0].register_forward_pre_hook(attach_here)
    for step in range(4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 0:
            handle.remove()
    diag_agent.stop()
    recs = [r for r in events(trace, schema.LAYER) if r["step"] >= 1]  # steps after the attach
    assert {r["module"] for r in recs} >= {"Sequential", "0", "1", "1.0", "1.1"}
    assert truth.module_tree_problems(recs) == []


class _Fused(torch.nn.Module):
    """A fused kernel that is not available here: raises, and its caller falls back (apex-style)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("fused kernel not built")


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fused = _Fused()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.fused(x)
        except RuntimeError:
            return self.fc(x)


def test_windows_nest_when_a_child_forward_raises(tmp_path) -> None:
    """A module whose forward raised (caught by its caller) never runs its post-hook: the next
    module's end must not close it instead (`layers.0` ran on until `layers.1` ended)."""
    trace = str(tmp_path / "trace")
    model = torch.nn.Sequential(_Layer(), _Layer())
    recs = _three_steps_recorded(model, trace)
    assert {r["module"] for r in recs} >= {"Sequential", "0", "1", "0.fc", "1.fc"}
    assert truth.module_tree_problems(recs) == []
    fwd = {(r["step"], r["module"]): r["flops"] for r in recs if r["phase"] == "fwd"}
    assert fwd[(1, "0")] == fwd[(1, "0.fc")] == 2 * 4 * 8 * 8


def test_megatron_logits_function_gets_a_named_window(tmp_path) -> None:
    """Issue 9: Megatron-DeepSpeed computes the output logits in `parallel_lm_logits`, a function
    that GPTModel's forward calls through its module's globals: no module hook saw the biggest
    matmul, and the root's FLOPs were more than its children's. The function, wherever a loaded
    `megatron` module holds it, runs in a window named after it: 2*tokens*hidden*vocab forward,
    twice that backward, and the root is its children's sum; stop puts the function back."""
    import types

    lm = types.ModuleType("megatron._diag_test_language_model")

    def parallel_lm_logits(input_: torch.Tensor, weight: torch.Tensor, parallel_output: bool) -> torch.Tensor:
        return torch.nn.functional.linear(input_, weight)

    lm.parallel_lm_logits = parallel_lm_logits  # type: ignore[attr-defined]

    class GPTModel(torch.nn.Module):
        def __init__(self, vocab: int, d: int) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, d)
            self.block = torch.nn.Linear(d, d)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return lm.parallel_lm_logits(self.block(self.embed(ids)), self.embed.weight, True)

    tokens, d, vocab = 4 * 8, 16, 32
    model = GPTModel(vocab, d)
    sys.modules[lm.__name__] = lm
    try:
        ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=1)
        ag.begin_step(0)
        model(torch.randint(0, vocab, (4, 8))).sum().backward()
        assert lm.parallel_lm_logits is not parallel_lm_logits
        diag_agent.stop()
    finally:
        del sys.modules[lm.__name__]
    assert lm.parallel_lm_logits is parallel_lm_logits
    got = {(r["module"], r["phase"]): r["flops"] for r in events(str(tmp_path), schema.LAYER)}
    logits, block = 2 * tokens * d * vocab, 2 * tokens * d * d
    assert got[("block", "fwd")] == block
    assert got[("parallel_lm_logits", "fwd")] == logits
    assert got[("parallel_lm_logits", "bwd")] == 2 * logits  # input and weight gradients
    for phase in ("fwd", "bwd"):
        children = got[("embed", phase)] + got[("block", phase)] + got[("parallel_lm_logits", phase)]
        assert got[("GPTModel", phase)] == children


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class RetryingBlock(torch.nn.Module):
    """Megatron-DeepSpeed's ParallelTransformerLayer: calls `self_attention` with a keyword an older
    signature lacks, catches the TypeError and calls it again without it."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attention = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.self_attention(x, rotary_pos_emb=None)
        except TypeError:
            return self.self_attention(x)


def test_a_forward_that_raised_leaves_no_record(tmp_path) -> None:
    """The retried call is one forward with its FLOPs; the call that raised (a 0-FLOP, 15 us forward
    before) leaves no record, and the retry inside the except block is not taken for a raise."""
    trace = str(tmp_path / "trace")
    model = RetryingBlock()
    recs = _three_steps_recorded(model, trace)
    fwd = [r for r in recs if r["phase"] == "fwd" and r["step"] == 1 and r["module"] == "self_attention"]
    assert [r["flops"] for r in fwd] == [2 * 4 * 8 * 8]
    assert truth.module_tree_problems(recs) == []


def _accumulating(trace: str, steps: int, joined: bool, ff_bb: bool = False, **options: Any) -> list[dict]:
    """A plain torch loop of 2 micro-batches a step (gradient accumulation), numbered by the steps
    collector from its first optimizer step; F B F B, or a pipeline stage's F F B B."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    diag_agent.start(trace, what=("layers",), joined=joined, **options)
    for _ in range(steps):
        if ff_bb:
            losses = [model(torch.randn(6, 8)).sum() for _ in range(2)]
            for loss in losses:
                loss.backward()
        else:
            for _ in range(2):
                model(torch.randn(6, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    diag_agent.stop()
    return events(trace, schema.LAYER)


ROOT_FWD, ROOT_BWD = 2 * 6 * 8 * 16 + 2 * 6 * 16 * 4, 2 * 6 * 8 * 16 + 2 * 2 * 6 * 16 * 4


def _root_flops(recs: list[dict]) -> dict[int, tuple[int, int, int]]:
    """step -> (root forwards recorded, forward FLOPs, backward FLOPs) summed over micro-batches."""
    out: dict[int, tuple[int, int, int]] = {}
    for r in recs:
        if r["module"] == "Sequential":
            n, f, b = out.get(r["step"], (0, 0, 0))
            fwd = r["phase"] == "fwd"
            out[r["step"]] = (n + fwd, f + (r["flops"] if fwd else 0), b + (0 if fwd else r["flops"]))
    return out


def test_the_first_step_is_sampled_whole_or_not_at_all(tmp_path) -> None:
    """Megatron-DeepSpeed, 2 micro-batches a step: before the first boundary the recorder sampled
    the first micro-batch alone, so step 1 had half its FLOPs (34.6 MFLOP for 69.2), reused for every
    step up to the first sampled one. Started with the job, the first step is sampled whole; after
    an attach (joined), which lands mid-step, not at all."""
    whole = _root_flops(_accumulating(str(tmp_path / "start"), 7, joined=False, layers_every=3))
    assert sorted(whole) == [0, 2, 3, 6]  # and the first steady one (`test_sampling_every_n_steps`)
    assert all(v == (2, 2 * ROOT_FWD, 2 * ROOT_BWD) for v in whole.values()), whole
    joined = _root_flops(_accumulating(str(tmp_path / "attach"), 7, joined=True, layers_every=3))
    assert sorted(joined) == [3, 6] and joined[3] == (2, 2 * ROOT_FWD, 2 * ROOT_BWD)


def test_a_stage_running_forwards_before_backwards_counts_both_backwards(tmp_path) -> None:
    """A pipeline stage (DeepSpeed's PipelineEngine, stage 0 of 2 with 2 micro-batches) runs F F B B.
    With flops_every 4 the second forward decided afresh not to count and popped the counting mode:
    both backwards had no FLOPs (stage 0's step 50: forward 7.34 M, backward none)."""
    recs = _accumulating(str(tmp_path), 6, joined=True, ff_bb=True, layers_every=1, flops_every=4)
    got = _root_flops(recs)
    assert sorted(got) == [1, 2, 3, 4, 5]  # step 0 is the attach's partial step
    assert all(v == (2, 2 * ROOT_FWD, 2 * ROOT_BWD) for v in got.values()), got
    assert all(r["flops"] is not None for r in recs)


@pytest.mark.parametrize(("first", "sampled"), [(0, {0, 2}), (1001, set())])
def test_first_steady_step_is_sampled_only_where_the_agent_saw_the_run_start(tmp_path, first, sampled):
    """Started with the job, the agent also samples its first steady step (the third): a run shorter
    than `layers_every` gets a steady sample. Started in-process mid-run (bench.overhead's blocks at
    step 1000; a job resumed from a checkpoint) it adds none: there its third step was sampled in
    every block, and the agent's 'not sampled' cost read 1.0 ms a rank-step (modules 398 us)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ag = diag_agent.start(str(tmp_path), what=("layers",), layers_every=50)
    for step in range(first, first + 6):
        if step:  # a fresh run's step 0 has no boundary before it
            ag.begin_step(step)
        model(torch.randn(6, 8)).sum().backward()
    ag.begin_step(first + 6)
    diag_agent.stop()
    assert set(_steps_of(str(tmp_path))) == sampled
