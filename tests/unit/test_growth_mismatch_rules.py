"""memory_growth and collective_mismatch (issue 17's memory-growth and desync faults) on small traces:
a planted case named with its rank and step, the healthy look-alike silent."""

from __future__ import annotations

import json
import os

import pytest

import diag
from diag import schema
from tests.unit.synth_trace import MS, Job, fired

MIB = 1 << 20


def _memory(per_step: dict[int, list[float]], counter: str = "rss") -> Job:
    """Per rank, one memory record a step with `counter` (bytes) as given."""
    job = Job(steps=len(next(iter(per_step.values()))), step_ms=50)
    for r, values in per_step.items():
        for s, v in enumerate(values):
            fields = {"allocated": None, "reserved": None, "peak": None, "rss": None, counter: int(v)}
            job.add(
                r,
                schema.MEMORY,
                step=s,
                ts=job.start(r, s) + 49 * MS,
                device="cpu",
                capacity=8 << 30,
                module=None,
                **fields,
            )
    return job


def test_memory_growing_every_step_is_named_with_its_rank(tmp_path):
    flat = [300 * MIB + (s < 2) * s * 40 * MIB for s in range(14)]  # warm-up growth, then flat
    leak = [300 * MIB + s * 4 * MIB for s in range(14)]
    (f,) = fired(_memory({0: flat, 1: leak}).write(str(tmp_path / "a")), "memory_growth")
    assert f.ranks == [1] and f.steps == [2, 13] and f.evidence["counter"] == "rss"
    assert f.evidence["growth"][1]["per_step_bytes"] == 4 * MIB
    assert f.evidence["steps_to_capacity"] == (8 * 1024 - 352) // 4
    # device memory is read first where the allocator's counter is there
    (g,) = fired(_memory({0: leak, 1: leak}, "allocated").write(str(tmp_path / "b")), "memory_growth")
    assert g.ranks == [0, 1] and g.evidence["counter"] == "allocated"


def test_memory_flat_noisy_small_or_short_is_silent(tmp_path):
    creep = [300 * MIB + s * 16 * 1024 for s in range(14)]  # 16 KiB a step: a healthy job's RSS
    noisy = [300 * MIB + (s % 3) * 8 * MIB for s in range(14)]  # up and down: not a leak
    short = [300 * MIB + s * 4 * MIB for s in range(9)]  # 7 steps after the warm-up: too few
    for name, v in (("creep", creep), ("noisy", noisy), ("short", short)):
        assert fired(_memory({0: v, 1: v}).write(str(tmp_path / name)), "memory_growth") == [], name


def _loss_sync(odd: dict[int, tuple[str, int]] | None = None, steps: int = 6) -> Job:
    """DDP-like steps: a bucket all-reduce, then the loss all-reduce (4 B); `odd` replaces rank r's
    loss call at the last step (a broadcast instead: a desync), which never completes."""
    job = Job(steps=steps, step_ms=100)
    for r in range(2):
        for s in range(steps):
            job.comm(r, s, nbytes=33280, at_ms=20, async_op=True, group="world:0")
            op, n = (odd or {}).get(r, ("all_reduce", 4)) if s == steps - 1 else ("all_reduce", 4)
            job.comm(r, s, op=op, nbytes=n, at_ms=60, group="world:0")
    return job


def test_a_rank_calling_a_different_collective_is_named(tmp_path):
    job = _loss_sync({1: ("broadcast", 4)})
    (f,) = fired(job.write(str(tmp_path / "a")), "collective_mismatch")
    assert f.ranks == [1] and f.steps == [5] and f.severity == "critical"
    assert f.evidence["group"] == "world:0" and f.evidence["collective"] == "broadcast"
    assert f.evidence["calls"] == {0: {"op": "all_reduce", "bytes": 4}, 1: {"op": "broadcast", "bytes": 4}}
    assert f.evidence["expected"] == {"op": "all_reduce", "bytes": 4}
    # a different size, on rank 0 this time
    (g,) = fired(_loss_sync({0: ("all_reduce", 8)}).write(str(tmp_path / "b")), "collective_mismatch")
    assert g.ranks == [0] and g.evidence["calls"][0]["bytes"] == 8


def test_matching_collectives_p2p_and_a_partial_first_step_are_silent(tmp_path):
    assert fired(_loss_sync().write(str(tmp_path / "a")), "collective_mismatch") == []
    # a pipeline's sends and receives differ by rank by design
    job = _loss_sync()
    job.comm(0, 3, op="send", nbytes=1024, at_ms=80, group="world:0")
    job.comm(1, 3, op="recv", nbytes=1024, at_ms=80, group="world:0")
    assert fired(job.write(str(tmp_path / "b")), "collective_mismatch") == []
    # attached mid-step 2: rank 0 saw only that step's loss all-reduce, rank 1 both calls
    job = Job(steps=6, step_ms=100)
    for r in range(2):
        for s in range(2, 6):
            if not (r == 0 and s == 2):
                job.comm(r, s, nbytes=33280, at_ms=20, group="world:0")
            job.comm(r, s, nbytes=4, at_ms=60, group="world:0")
    assert fired(job.write(str(tmp_path / "c")), "collective_mismatch") == []


def _live(trace):
    for r in trace.headers:
        trace.headers[r]["process"] = {"pid": 1000 + r, "state": "S", "checked_ns": 0}
    return trace


def test_live_only_final_records_are_compared(tmp_path):
    """A live trace: the agent holds a record whose duration is pending (up to 10 s) while later
    ones are written, so a rank's file can lack a call its peer's has; the calls that never
    completed (null duration, written once given up) are final."""
    job = _loss_sync()
    job.events[1] = [e for e in job.events[1] if not (e["step"] == 5 and e["bytes"] == 33280)]  # held
    assert fired(_live(job.write(str(tmp_path / "held"))), "collective_mismatch") == []
    assert fired(job.write(str(tmp_path / "held_done")), "collective_mismatch") != []  # a finished trace
    job = _loss_sync({1: ("broadcast", 4)})
    for r in range(2):
        job.events[r][-1]["dur"] = None  # the two calls never completed: given up on after 10 s
        job.add(r, schema.STATS, ts=job.start(r, 5) + 11_000 * MS, captured={}, dropped={}, errors={})
    (f,) = fired(_live(job.write(str(tmp_path / "stuck"))), "collective_mismatch")
    assert f.ranks == [1] and f.evidence["step"] == 5


def test_a_partial_first_step_numbered_0_is_silent(tmp_path):
    """An FSDP2 job attached within its first optimizer step: both ranks' steps start at 0 (the
    optimizer's count), but rank 0's records begin at that step's reduce-scatter and rank 1's at its
    all-gather (a public FSDP2 example read as a CRITICAL mismatch at step 0)."""
    job = Job(steps=6, step_ms=100)
    for r in range(2):
        for s in range(6):
            if not (r == 0 and s == 0):
                job.comm(r, s, op="all_gather", nbytes=12864, at_ms=20, group="world:0")
            job.comm(r, s, op="reduce_scatter", nbytes=12864, at_ms=60, group="world:0")
    assert fired(job.write(str(tmp_path / "a")), "collective_mismatch") == []


def test_the_first_differing_call_matches_a_call_by_call_search():
    """`_first_differing` finds with whole-column operations what a search call by call finds (the
    rule's first form, 5.7 s a look on a 1-minute DDP job of 1 ms steps in `diag watch`): random
    traces of 1-4 ranks, two groups, missing calls, unknown sizes and all-to-all sizes; and each
    call's position `k` is the one a groupby of the calls sorted by time gives."""
    import random

    import numpy as np
    import pandas as pd
    from diag.analyzers import collective_mismatch as cm

    def by_call(c: pd.DataFrame) -> list[tuple[str, int, int]]:
        out = []
        for group, g in c.groupby("group", sort=True):
            members = g["rank"].nunique()
            for (step, k), at in g.groupby(["step", "k"], sort=True):
                sigs = {cm._sig(row) for _, row in at.iterrows()}
                if members >= 2 and at["rank"].nunique() == members and len(sigs) > 1:
                    out.append((str(group), int(step), int(k)))
                    break
        return out

    rng, found = random.Random(7), 0
    for _ in range(150):
        rows, ts = [], 0
        for r in range(rng.choice([1, 2, 3, 4])):
            for step in range(1, 6):
                for _ in range(rng.randint(1, 4)):
                    ts += 1
                    nbytes = rng.choice([4, 4, 4, 8, None])
                    if rng.random() < 0.05:
                        continue  # a call this rank never recorded
                    rows.append(
                        {
                            "rank": r,
                            "group": rng.choice(["world:0", "tp:1"]),
                            "step": step,
                            "ts": ts,
                            "kind": rng.choice(["all_reduce"] * 6 + ["broadcast", "all_to_all"]),
                            "bytes": 16 if rng.random() < 0.1 else nbytes,
                        }
                    )
        df = pd.DataFrame(rows)
        calls = cm._keyed(df, np.ones(len(df), dtype=bool), {})
        first = df.groupby("rank")["step"].transform("min")
        c = df[df["step"] > first].assign(k=calls.k)  # the rows keyed: each rank's first step left out
        assert calls.rows.tolist() == np.flatnonzero(df["step"] > first).tolist()
        by_ts = c.sort_values("ts", kind="stable")  # `k` as the groupby of a sorted copy gives it
        assert c["k"].tolist() == by_ts.groupby(["group", "step", "rank"]).cumcount()[c.index].tolist()
        expected = by_call(c)
        found += bool(expected)
        assert cm._first_differing(calls) == expected
    assert 50 < found < 150  # both kinds of trace were drawn


@pytest.mark.parametrize("numbered", [5, 4])
def test_the_first_step_of_a_reattach_is_silent(tmp_path, numbered):
    """Attach, detach, attach again to a healthy job: the second session begins inside step 5 on
    each rank at its own point (rank 0 after that step's first all-reduce), and its first boundary's
    step record has no duration. A re-attach to the real Megatron-DeepSpeed job read "collective
    mismatch in group tp:6 at step 127" (CRITICAL) at that step, in 2 runs of 2. The calls of that
    step can carry the number before its boundary's (306 under a record of 307): placed by time."""
    job = Job(steps=8, step_ms=100)
    for r in range(2):
        for s in (0, 1, 2, 5, 6, 7):  # detached over steps 3 and 4
            if not (r == 0 and s == 5):
                job.comm(r, s, nbytes=33280, at_ms=20, group="world:0")
            job.comm(r, s, nbytes=4, at_ms=60, group="world:0")
    path = str(tmp_path / "reattach")
    job.write(path)
    for r in range(2):
        name = os.path.join(path, f"rank-{r:05d}.jsonl")
        recs = [json.loads(line) for line in open(name)]
        recs = [e for e in recs if not (e["k"] == "step" and e["step"] in (3, 4))]
        for e in recs:
            if e["k"] == "step" and e["step"] == 5:
                e["dur"] = None  # the second session's first boundary
            elif e["k"] == "comm" and e["step"] == 5:
                e["step"] = numbered
        with open(name, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in recs)
    assert fired(diag.load(path), "collective_mismatch") == []


def _profiled_pair(tmp_path, named: bool, same_group: bool) -> list[str]:
    """Two ranks' profiler traces, 4 steps: rank 0 issues an all_to_all then an all_reduce, rank 1
    the other order. Named: `Process Group Name` recorded (the all_to_all's group "1", or "0" like
    the all_reduce's when `same_group`)."""
    from tests.unit.kineto_synth import Kineto

    paths = []
    for rank, order in ((0, ("alltoall", "allreduce")), (1, ("allreduce", "alltoall"))):
        k = Kineto(rank=rank, world=2)
        for s in range(4):
            t0 = s * 1000
            k.step(s, t0, 1000)
            for i, op in enumerate(order):
                at = t0 + 100 + 300 * i
                args: dict = {"Collective name": op, "In msg nelems": 1024, "dtype": "Float", "Group size": 2}
                if named:
                    args["Process Group Name"] = "0" if op == "allreduce" or same_group else "1"
                k.host("record_param_comms", at, 40, args)
                kernel = (
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
                    if op == "allreduce"
                    else "ncclDevKernel_SendRecv"
                )
                k.kernel(kernel, at + 60, 100, launch=at + 10, stream=30)
        paths.append(k.write(tmp_path / f"rank{rank}.json"))
    return paths


@pytest.mark.parametrize(
    "named, same_group, fires",
    [(False, False, False), (True, False, False), (True, True, True)],
)
def test_profiler_traces_compare_only_groups_they_recorded(tmp_path, named, same_group, fires):
    """Without `Process Group Name` the calls' communicators are unknown: an all_to_all on one and an
    all_reduce on another interleave freely (HTA's public 128-rank sample read as a CRITICAL
    mismatch); recorded in two groups they match group by group; in one group they differ."""
    from diag.importers import load_inputs

    trace = load_inputs(_profiled_pair(tmp_path, named, same_group))
    assert len(trace.comms) == 16
    got = fired(trace, "collective_mismatch")
    assert bool(got) == fires, [f.title for f in got]
    if fires:
        assert got[0].evidence["group"] == "0" and got[0].evidence["step"] == 1
