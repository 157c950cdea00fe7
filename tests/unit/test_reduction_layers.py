"""The report's reductions of the layer records (`layer_stats.LayerSums`, `throughput.StepFlops`) are
the same computed a window of steps at a time and merged as on the whole trace, and so are the
top-layers table and the per-step FLOPs read from them."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from diag import schema
from diag.metrics import layer_sums, throughput, window_metrics
from diag.metrics.layer_stats import LayerSums
from diag.metrics.stage import Metrics
from diag.report import trace_doc
from diag.report.records import plain
from diag.trace.reader import load_trace
from tests.unit.synth_trace import MS, T0, Job
from tests.unit.windowing import assert_windowed, diag_folders, windows

# folders with layer records, of different shapes (TP, ZeRO-3, overflow, a hang, long jobs, joined logs)
SHAPES = {"healthy", "megatron_tp2", "input_stall", "fp16_overflow", "zero3", "straggler", "join"}
SHAPES |= {"hang_killed_early", "straggler_onset", "embedding_heavy"}
FOLDERS = [d for d in diag_folders() if os.path.basename(d) in SHAPES]


def _same_sums(a: layer_sums.Sums, b: layer_sums.Sums) -> None:
    """Equal sums (exact: ns, FLOPs and bytes are integers) and the equal tables they give."""
    pd.testing.assert_frame_equal(a.modules, b.modules, check_exact=True)
    pd.testing.assert_frame_equal(a.phases, b.phases, check_exact=True)
    pd.testing.assert_frame_equal(_table(a), _table(b), check_exact=True)


def _table(s: layer_sums.Sums) -> pd.DataFrame:
    return layer_sums.table(layer_sums.chosen(s), 10.0)


def _same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_folders_have_the_shapes_named():
    assert len(FOLDERS) == len(SHAPES), sorted(SHAPES - {os.path.basename(d) for d in FOLDERS})


@pytest.mark.parametrize("folder", FOLDERS, ids=os.path.basename)
def test_layer_sums_and_step_flops_merge_to_the_whole(folder):
    """A shape's sums and FLOPs per (rank, step), merged over windows of 1, 3 and all steps; the
    whole one gives the report's rows (`trace_doc.layers` of the records, the reference)."""
    trace = load_trace(folder)
    sums = assert_windowed(trace, LayerSums(), _same_sums)
    assert len(sums.modules) and _table(sums)["flops"].gt(0).any()
    flops = assert_windowed(trace, throughput.StepFlops(), _same_frame)
    assert len(flops) and flops["flops"].notna().any()
    rows = trace_doc.layers(trace, 10.0, metrics=Metrics(trace))
    assert plain(rows) == plain(trace_doc.layers(trace, 10.0))


def test_the_steady_choice_and_lowest_rank_are_made_on_the_merged_sums(tmp_path):
    """Rank 0 sampled steps 0, 5 and 6, rank 1 (a pipeline stage numbered `layers.0` locally, layer 1
    model-wide) step 0 alone: windows of 1 step hold rank 0's warm-up step apart from its steady
    ones, whose samples leave the warm-up's out (their means over two windows); rank 1's warm-up
    table stays, named model-wide."""
    job = Job(ranks=2, steps=8)
    job.add(1, schema.META, ts=T0, key=schema.META_LAYER_NUMBERS, value={"layers.0": 1})
    for rank, steps in ((0, (0, 5, 6)), (1, (0,))):
        for step in steps:
            ms = 50 if step == 0 else 4  # the warm-up's forward: slow
            for name, flops in (("layers.0", 10**6), ("embed", 2 * 10**6), ("Model", 9 * 10**6)):
                ts = job.start(rank, step)
                job.add(
                    rank,
                    schema.LAYER,
                    step=step,
                    module=name,
                    phase="fwd",
                    ts=ts,
                    dur=ms * MS,
                    flops=flops,
                    mem_delta=1024 * step,
                )
    trace = job.write(str(tmp_path))
    sums = assert_windowed(trace, LayerSums(), _same_sums)
    whole = Metrics(trace)
    context = window_metrics.Whole.of(whole)
    merged = window_metrics.merged(LayerSums(), windows(trace, 1), context)
    top = _table(merged).set_index("module")
    assert set(top.index) == {"layers.0", "layers.1", "embed"}
    assert top.loc["layers.0", "fwd_ms"] == 4.0 and not top.loc["layers.0", "warmup"]  # rank 0's steady
    assert top.loc["layers.0", "steps"] == 2 and top.loc["layers.0", "mem_delta"] == 5.5 * 1024
    assert top.loc["layers.1", "fwd_ms"] == 50.0 and top.loc["layers.1", "warmup"]  # rank 1's warm-up
    assert plain(trace_doc.layers(trace, 10.0, metrics=whole)) == plain(trace_doc.layers(trace, 10.0))
    assert plain(_table(sums).astype(object).to_dict("records")) == plain(trace_doc.layers(trace, 10.0))
