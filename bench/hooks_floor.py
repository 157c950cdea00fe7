"""The floor under the agent's always-on cost: what the least Python agent with diag's hook points
pays per rank-step in bench/overhead's job (2 ranks, ZeRO-2 bf16, CPU/gloo), measured side by side
with diag's own self-timed cost (issue 9's goal: at most 0.1 ms a rank-step).

    python -c "from tests.workloads import launch; print(launch.run('bench.hooks_floor', ['4', '10']).stdout)"

(arguments: rounds, steps a block.) The floor agent records the least diag records: around each
collective method of `ProcessGroup` (diag's hook points) the call's op, issue time and duration
appended to a list; around DeepSpeed's step boundary (`_take_model_step`, diag's) the step number and
its end; a writer thread that wakes on the same 0.5 s wall-clock ticks as diag's, turns each record
into a JSON line with one f-string and writes them. No overflow or loss check, memory record, group
name, byte count, module attribution or bandwidth: whatever diag does beyond this costs more.

Both are timed the way the agent times itself (`self_time`): thread CPU time inside each hook's own
part (not the wrapped call, not the wrapper's glue), less the timing's calibrated share, plus the
writer thread's CPU time; blocks alternate floor / diag each round, each block's first two steps
left out (as bench/overhead's SELF_SKIP). The cost is mostly cold-cache cost: between two steps the
job's compute evicts the hook's code and data, so a hook that runs in ~0.5 us warm costs 10-40 us.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from bench.variants import NEVER, SELF_SKIP, own_ns, own_split, run_block
from tests.workloads import common, gpt_ds, shims

JOB = ["--zero", "2", "--dtype", "bf16", "--hidden", "128", "--layers", "4", "--seq", "64"]
TICK_S = 0.5  # diag's FLUSH_INTERVAL_S
clock = time.thread_time_ns
perf = time.perf_counter_ns


class Floor:
    """Hooks that append one tuple a call, and a writer thread: the least an agent does."""

    def __init__(self, path: str) -> None:
        self.recs: list[tuple[Any, ...]] = []
        self.hook_ns = 0
        self.hook_calls = 0
        self.writer_ns = 0
        self.file = open(path, "w")  # closed by stop()
        self.undo: list[tuple[Any, str, Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.probe_ns = self._calibrate()

    def _calibrate(self, n: int = 5000) -> float:
        """The timing's own share of one timed part (two clock reads), warm: subtracted per call, as
        the agent's `_calibrate` does."""
        best = None
        for _ in range(5):
            t0 = clock()
            for _ in range(n):
                c = clock()
                _ = clock() - c
            per = (clock() - t0) / n
            best = per if best is None else min(best, per)
        return best or 0.0

    def own_ns(self) -> int:
        return self.hooks_ns() + self.writer_ns

    def hooks_ns(self) -> int:
        return int(self.hook_ns - self.hook_calls * self.probe_ns)

    def patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name]
        self.undo.append((owner, name, original))
        setattr(owner, name, make(original))

    def start(self, engine_cls: type) -> None:
        from diag.collectors.comms.ops import METHODS
        from torch.distributed import ProcessGroup

        for name in METHODS:
            if name in ProcessGroup.__dict__:
                self.patch(ProcessGroup, name, lambda orig, op=name: self._collective(op, orig))
        self.patch(engine_cls, "_take_model_step", self._boundary)
        self.thread.start()

    def stop(self) -> None:
        for owner, name, original in reversed(self.undo):
            setattr(owner, name, original)
        self.done.set()
        self.thread.join()
        self._flush()
        self.file.close()

    def _collective(self, op: str, original: Any) -> Any:
        floor = self

        def wrapper(pg: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = perf()
            work = original(pg, *args, **kwargs)
            c0 = clock()
            floor.recs.append((op, t0, perf() - t0))
            floor.hook_ns += clock() - c0
            floor.hook_calls += 1
            return work

        return wrapper

    def _boundary(self, original: Any) -> Any:
        floor = self

        def wrapper(engine: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(engine, *args, **kwargs)
            c0 = clock()
            floor.recs.append(("step", engine.global_steps, perf()))
            floor.hook_ns += clock() - c0
            floor.hook_calls += 1
            return out

        return wrapper

    def _run(self) -> None:
        wake = TICK_S - time.time() % TICK_S
        while not self.done.wait(wake):
            c0 = clock()  # as the agent counts its writer: from the wake to the next wait
            self._flush()
            wake = TICK_S - time.time() % TICK_S
            self.writer_ns += clock() - c0

    def _flush(self) -> None:
        recs, self.recs = self.recs, []
        if recs:
            self.file.write("".join(f'{{"k":"{r[0]}","a":{r[1]},"b":{r[2]}}}\n' for r in recs))
            self.file.flush()


def measured(name: str, engine: Any, args: Any, rank: int, step: int, block: int) -> tuple[int, int]:
    """One block with the floor agent or diag's on: its own CPU ns over the counted steps, (hooks,
    writer thread)."""
    from diag import agent

    marks: list[tuple[int, int]] = []
    if name == "floor":
        floor = Floor(tempfile.mkdtemp(prefix="diag-floor-") + "/floor.jsonl")
        floor.start(type(engine))
        parts: Callable[[], tuple[int, int]] = lambda: (floor.hooks_ns(), floor.writer_ns)  # noqa: E731
    else:
        agent.start(tempfile.mkdtemp(prefix="diag-floor-"), layers_every=NEVER, self_time=True)
        parts = lambda: (own_ns() - own_split()["writer"], own_split()["writer"])  # noqa: E731
    run_block(engine, args, rank, step, block, lambda: marks.append(parts()), SELF_SKIP)
    end = parts()
    floor.stop() if name == "floor" else agent.stop()
    return end[0] - marks[0][0], end[1] - marks[0][1]


def main(argv: list[str]) -> None:
    rounds = int(argv[0]) if argv else 4
    block = int(argv[1]) if len(argv) > 1 else 10
    args = gpt_ds.parse_args(JOB)
    shims.deepspeed_cpu()
    rank, _ = common.init_process_group()
    engine, _, _ = gpt_ds.make_engine(args, rank)
    run_block(engine, args, rank, 0, block)  # warm-up
    engine.global_steps = step = 1000
    own: dict[str, list[tuple[int, int]]] = {"floor": [], "diag": []}
    for r in range(rounds):
        for name in ("floor", "diag") if r % 2 == 0 else ("diag", "floor"):
            dist.barrier()
            own[name].append(measured(name, engine, args, rank, step, block))
            step += block
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, own)
    if rank == 0:
        counted = rounds * (block - SELF_SKIP) * len(everyone)
        hooks = {k: sum(h for o in everyone for h, _ in o[k]) / counted / 1e3 for k in own}
        writer = {k: sum(w for o in everyone for _, w in o[k]) / counted / 1e3 for k in own}
        per = {k: hooks[k] + writer[k] for k in own}
        print(f"{rounds} rounds x {block} steps, {len(everyone)} ranks; us of CPU per rank-step (self-timed)")
        for k, label in (("floor", "floor (the least Python agent, diag's hook points)"), ("diag", "diag")):
            print(f"  {label:52s} {per[k]:7.1f} (hooks {hooks[k]:6.1f}, writer {writer[k]:6.1f})")
        ratio = per["diag"] / per["floor"]
        print(f"  diag / floor {ratio:.2f}x; the goal, 100 us, is {100 / per['floor']:.2f}x the floor")
    common.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
