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


def _steady_by_index(layers, steady):
    """`steady_samples` as a (rank, step) index defines it (the reference)."""
    import pandas as pd

    keys = pd.MultiIndex.from_frame(layers[["rank", "step"]].astype("int64"))
    warm = pd.Series(
        ~keys.isin(pd.MultiIndex.from_frame(steady[["rank", "step"]].astype("int64"))), layers.index
    )
    steady_rank = (~warm).groupby(layers["rank"]).transform("any")
    return layers.assign(warmup=warm)[~(warm & steady_rank)]


def test_steady_rows_per_rank_equal_the_index_and_the_lowest_ranks_table():
    """`steady_samples` one rank at a time gives the (rank, step) index's rows, on ranks in any order,
    ranks without a steady step and steps without a sample; `trace_doc.layers`, which takes each
    module's lowest rank's records only, gives `top_layers` of every steady record."""
    import random

    import pandas as pd

    from diag.metrics.layer_stats import steady_samples, top_layers
    from diag.report.records import plain

    rng = random.Random(11)
    for _ in range(40):
        rows = [
            {
                "rank": rng.choice([0, 1, 2, 5]),
                "step": rng.randint(0, 5),
                "module": rng.choice(["m", "m.a", "m.b", "n.c"]),
                "phase": rng.choice(["fwd", "bwd"]),
                "ts": rng.randint(0, 10**6),
                "dur": rng.randint(1, 1000),
                "flops": rng.randint(0, 10**6),
                "mem_delta": None,
            }
            for _ in range(rng.randint(1, 60))
        ]
        layers = pd.DataFrame(rows, index=rng.sample(range(1000), len(rows)))
        steady = pd.DataFrame(
            [(r, s) for r in (0, 1, 2) for s in range(rng.randint(0, 6), 6)], columns=["rank", "step"]
        )
        want = _steady_by_index(layers, steady)
        pd.testing.assert_frame_equal(steady_samples(layers, steady), want)

        class Trace:  # what `trace_doc.layers` reads of a trace: the layer records, the headers
            headers: dict = {}

        trace = Trace()
        trace.layers = layers
        got = trace_doc.layers(trace, 10.0, steady)
        assert plain(got) == plain(top_layers(want, 10.0).astype(object).to_dict("records"))
