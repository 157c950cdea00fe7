"""More cells of the fault matrix (issue 17), on the DDP job: a desync, memory growth, an input stall.

Each uses `Cell` / `run_cell` of tests/integration/faults.py; none is in the short CI matrix (they run
with DIAG_FULL_MATRIX=1, as bench.faults sets). The faults, planted by the workload's switches
(tests/workloads/planted.py) and from outside:
- desync: every rank all-reduces its loss each step; rank 1, sent SIGUSR1 (the recorded fault time),
  calls a broadcast instead at its next step. The group hangs in the two calls; collective_mismatch
  must name rank 1, the group and the step, within 10 s: the agent writes each call still waited in
  after 1.5 s as entered (`comm_open`), without waiting out its 10 s hold;
- memory growth: rank 1 keeps 4 MiB every step; memory_growth must name it from the RSS per step;
- input stall: rank 1 sleeps 80 ms before each step's batch (the straggler cell's switch) with the
  layers recorded every step, so the lead-in before its forward is measured: idle_between_steps must
  name rank 1; and its counterpart, a compute straggler (rank 1 sleeps 80 ms between its forward and
  backward, layers recorded every step): straggler names rank 1 and idle_between_steps stays silent;
- slow link: ZeRO-3 with each rank in its own network namespace, joined by a veth limited to 40 Mbit/s
  (sample_traces/netns.py: the kernel here has no netem, so tc tbf: bandwidth, not added latency);
  zero3_slow_link must name it. Needs root, `ip`, `tc` and `unshare` (`netns.unavailable()` says why
  not); its control: the same job in the same namespaces on a plain veth, where nothing may fire.
"""

from __future__ import annotations

import os

from sample_traces import generate_scenarios, netns
from tests.integration.faults import DDP_ARGS, LONG_DDP, SLOW, Cell, Outcome, alarms, run_cell, steps_to_find
from tests.integration.runs import DDP, GPT, Runs

SLOW_LINK_RATE = "40mbit"  # tc tbf on both ends of the veth between the ranks' namespaces
SLOW_LINK = Cell(
    "ZeRO-3",
    "slow link",
    GPT,
    ("--zero", "3", "--steps", "8"),
    expect="zero3_slow_link",  # alone: exposed_comm defers to it (the exposed time is those gathers)
)

# its control: the same job and namespaces on a plain veth. Until zero3_slow_link read the link's
# bandwidth from the large transfers only, this job was called "ZeRO-3 gathers across nodes run at
# 0.26 MB/s, 49% of each step" (critical): its 768-byte gathers' latency and waiting, not the link
LINK_CONTROL = Cell("ZeRO-3", "healthy, plain link between namespaces", GPT, SLOW_LINK.args)
NAMESPACED = {SLOW_LINK: SLOW_LINK_RATE, LINK_CONTROL: None}  # cell -> its link's rate

EXTRA_CELLS: tuple[Cell, ...] = (
    Cell(
        "DDP",
        "desync",
        DDP,
        (*LONG_DDP, "--desync-rank", "1"),
        expect="collective_mismatch",
        rank=1,
        inject="usr1",
    ),
    Cell(
        "DDP",
        "memory growth",
        DDP,
        ("--steps", "16", "--leak-rank", "1", "--leak-mb", "4"),
        expect="memory_growth",
        rank=1,
    ),
    Cell("DDP", "healthy, layers every step", DDP, (*DDP_ARGS, "--layers-every", "1")),
    Cell(
        "DDP",
        "input stall",
        DDP,
        (*DDP_ARGS, *SLOW, "--layers-every", "1"),
        expect="idle_between_steps",
        rank=1,
    ),
    Cell(
        "DDP",
        "compute straggler",
        DDP,
        (*DDP_ARGS, "--compute-slow-rank", "1", "--compute-slow-ms", "80", "--layers-every", "1"),
        expect="straggler",
        rank=1,
    ),
    SLOW_LINK,
    LINK_CONTROL,
)


def slow_link_unavailable(cell: Cell) -> str | None:
    """Why this cell cannot run here (None: it can, or it needs no namespaces)."""
    return netns.unavailable() if cell in NAMESPACED else None


def run_extra(cell: Cell, runs: Runs, folder: str) -> Outcome:
    """`run_cell`, or for the slow link and its control: both ranks in their namespaces, then every
    rule on the trace."""
    if cell not in NAMESPACED:
        return run_cell(cell, runs, folder)
    trace = os.path.join(folder, "trace")
    flags = (str(cell.expect),) if cell.expect else ()
    sc = generate_scenarios.Scenario(cell.fault, flags, cell.args, slow_link=True)
    generate_scenarios.run_slow_link(sc, [*cell.args, "--diag", "--trace-dir", trace], rate=NAMESPACED[cell])
    out = Outcome(cell, alarms([trace]))
    if cell.expect is not None:
        out.steps_to_find = steps_to_find(trace, cell.expect, cell.rank)
    return out
