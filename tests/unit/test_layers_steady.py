"""The top-layers table from steady samples: the first steps are the warm-up (lazy set-up, the first
collectives' connections), left out where a steady step was sampled and said where they are all
there is."""

from __future__ import annotations

import pytest

from diag import schema
from diag.report import trace_doc
from diag.report.trace_tables import layers_table
from tests.unit.synth_trace import MS, Job

WARM_MS, STEADY_MS = 115.7, 4.1  # rank 0's embedding forward at step 0 and a steady step (megatron-core TP=2)


def _job(sampled: tuple[int, ...]) -> Job:
    """2 ranks, 12 steps; layer records of an embedding and a linear on the `sampled` steps, the
    embedding's forward slow on the first step (its first all_reduce waits for the other rank)."""
    job = Job(ranks=2, steps=12)
    for rank in range(job.ranks):
        for step in sampled:
            embed = WARM_MS if step == 0 else STEADY_MS
            for name, ms in (("embedding", embed), ("linear", 3.0), ("GPTModel", embed + 3.0)):
                for phase in ("fwd", "bwd"):
                    job.add(
                        rank,
                        schema.LAYER,
                        step=step,
                        module=name,
                        phase=phase,
                        ts=job.start(rank, step),
                        dur=int((ms if phase == "fwd" else 1.0) * MS),
                        flops=9 * 10**6 if name == "GPTModel" else 10**6,  # the root: not a leaf
                    )
    return job


def test_a_short_runs_table_is_its_steady_sample(tmp_path) -> None:
    """A 12-step run at the default --layers-every 50 now samples steps 0 and 2 (the first steady
    one): the table is step 2's, not the mean with step 0's warm-up (59.9 ms for the embedding's
    forward)."""
    rows = {r["module"]: r for r in trace_doc.layers(_job((0, 2)).write(str(tmp_path)), None)}
    assert rows["embedding"]["fwd_ms"] == pytest.approx(STEADY_MS) and rows["embedding"]["steps"] == 1
    assert not any(r["warmup"] for r in rows.values())
    ((title, _, _),) = layers_table({"layers": list(rows.values())})
    assert "mean of 1 steady sampled step" in title, title


def test_a_table_of_the_first_step_alone_says_so(tmp_path) -> None:
    """A trace with step 0 sampled alone (an agent that sampled no steady step): its figures are all
    there is, and the title says they are the warm-up's."""
    rows = trace_doc.layers(_job((0,)).write(str(tmp_path)), None)
    assert {r["module"]: r["fwd_ms"] for r in rows}["embedding"] == pytest.approx(WARM_MS)
    assert all(r["warmup"] for r in rows)
    ((title, _, _),) = layers_table({"layers": rows})
    assert "warm-up steps only" in title, title


def test_a_long_runs_samples_leave_the_first_step_out(tmp_path) -> None:
    """Steps 0, 2 and 10 sampled (as 0, 2 and 50 of a longer run): the mean is over steps 2 and 10
    (the warm-up weighed a third)."""
    rows = {r["module"]: r for r in trace_doc.layers(_job((0, 2, 10)).write(str(tmp_path)), None)}
    assert rows["embedding"]["fwd_ms"] == pytest.approx(STEADY_MS) and rows["embedding"]["steps"] == 2
