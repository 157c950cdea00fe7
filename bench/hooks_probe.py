"""Where the always-on agent's microseconds go: CPU time per hook and in the writer thread, per
rank-step, in bench/overhead's job (2 ranks, ZeRO-2 bf16, not sampled); rank 0 prints a table.

    python -c "from tests.workloads import launch; print(launch.run('bench.hooks_probe', ['20']).stdout)"

Each guarded hook is timed by label (`collector:where`, thread CPU time; a hook run inside another,
a step listener inside the steps hook, is in its caller's figure and listed apart, marked `>`), and
the writer's flushes and idle listeners apart; PROBE_CPROFILE=1 adds a cProfile of rank 0's steps
(wall-clock: useless on a loaded host). To compare two trees side by side, run this module from
each at the same time (a copy of the old tree with diag/collectors linked to its collectors/ and
on PYTHONPATH); the figures are CPU time, so the load inflates both alike.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

import torch.distributed as dist

from bench.variants import NEVER, run_block
from tests.workloads import common, gpt_ds, shims

JOB = ["--zero", "2", "--dtype", "bf16", "--hidden", "128", "--layers", "4", "--seq", "64"]
PER: dict[str, list[int]] = defaultdict(lambda: [0, 0])
clock = time.thread_time_ns


def _count(label: str, t0: int) -> None:
    rec = PER[label]
    rec[0] += clock() - t0
    rec[1] += 1


def instrument() -> None:
    """Time every guarded hook by label and the writer's two jobs (before the agent starts)."""
    from diag.agent import runtime

    orig_guard = runtime.Agent.guard
    local = {"on": False}

    def guard(self: Any, collector: str, fn: Any, where: str | None = None) -> Any:
        g = orig_guard(self, collector, fn, where)
        label = f"{collector}:{where or getattr(fn, '__name__', 'hook')}"

        def timed(*a: Any, **k: Any) -> Any:
            if local["on"]:  # inside another hook: in its caller's figure; listed apart, marked >
                t0 = clock()
                try:
                    return g(*a, **k)
                finally:
                    _count(f"> {label}", t0)
            local["on"] = True
            t0 = clock()
            try:
                return g(*a, **k)
            finally:
                _count(label, t0)
                local["on"] = False

        return timed

    runtime.Agent.guard = guard  # type: ignore[method-assign]
    for meth in ("_flush", "_run_idle_listeners"):
        orig = getattr(runtime.Agent, meth)

        def timed_meth(
            self: Any, *a: Any, _orig: Any = orig, _label: str = f"writer:{meth}", **k: Any
        ) -> Any:
            t0 = clock()
            try:
                return _orig(self, *a, **k)
            finally:
                _count(_label, t0)

        setattr(runtime.Agent, meth, timed_meth)


def _nested(label: str, fn: Any) -> Any:
    """`fn` timed as a part of the hook that runs it (listed apart, marked >)."""

    def timed(*a: Any, **k: Any) -> Any:
        t0 = clock()
        try:
            return fn(*a, **k)
        finally:
            _count(f"> {label}", t0)

    return timed


def instrument_inline(ag: Any) -> None:
    """Time what runs inline in another hook (after the agent started): the step listeners and
    the DeepSpeed boundary's parts."""
    from diag.collectors.boundary import DsBoundary
    from diag.collectors.layers import LayerRecorder

    from diag.agent.api import StepListener

    ag.step_listeners[:] = [StepListener(c, w, _nested(f"{c}:{w}", fn)) for c, w, fn in ag.step_listeners]
    recorder = ag.state.get(LayerRecorder)  # it leaves and rejoins the listeners: as the timed one
    timed = next((f for f in ag.step_listeners if f.collector == "layers"), None)
    if recorder is not None and timed is not None:
        recorder.listener = timed
    boundary = ag.state.get(DsBoundary)
    if boundary is not None:
        boundary.parts = [
            p._replace(
                before=p.before and _nested(f"{p.collector}:ds-before", p.before),
                after=_nested(f"{p.collector}:ds-after", p.after),
            )
            for p in boundary.parts
        ]
        boundary.plain_parts = boundary.parts  # an engine's steps that need only the counters


def main(argv: list[str]) -> None:
    steps = int(argv[0]) if argv else 20
    args = gpt_ds.parse_args([*JOB, *argv[1:]])
    shims.deepspeed_cpu()
    rank, _ = common.init_process_group()
    engine, _, _ = gpt_ds.make_engine(args, rank)
    run_block(engine, args, rank, 0, 10)
    engine.global_steps = 1000  # past the first steps the agent tracks throughout
    instrument()
    from diag import agent

    agent.start(tempfile.mkdtemp(prefix="diag-probe-"), layers_every=NEVER)
    run_block(engine, args, rank, 1000, 2)
    instrument_inline(agent.current())
    PER.clear()
    w0 = agent.current().status()["writer_cpu_ns"]  # type: ignore[union-attr]
    prof = cProfile.Profile() if os.environ.get("PROBE_CPROFILE") and rank == 0 else None
    if prof:
        prof.enable()
    c0 = time.process_time()
    times = run_block(engine, args, rank, 1002, steps)
    cpu = time.process_time() - c0
    if prof:
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(r"diag|collectors")
        print(buf.getvalue()[:12000])
    writer = agent.current().status()["writer_cpu_ns"] - w0  # type: ignore[union-attr]
    agent.stop()
    if rank == 0:
        hooks = sum(v[0] for k, v in PER.items() if not k.startswith(("writer:", ">")))
        wall = sorted(t[0] for t in times)[steps // 2]
        print(f"steps {steps}, step cpu {cpu / steps * 1e3:.2f} ms, wall median {wall * 1e3:.2f} ms")
        print(
            f"hooks {hooks / steps / 1e3:.1f} us/step, writer {writer / steps / 1e3:.1f} us/step; "
            f"sum {(hooks + writer) / steps / 1e3:.1f} us per rank-step"
        )
        for k, (ns, n) in sorted(PER.items(), key=lambda kv: -kv[1][0]):
            print(
                f"  {k:35} {ns / steps / 1e3:8.1f} us/step {n / steps:6.1f} calls/step "
                f"{ns / max(n, 1) / 1e3:6.2f} us/call"
            )
    dist.barrier()
    common.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
