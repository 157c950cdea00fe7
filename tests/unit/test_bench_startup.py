"""The 2 KB inputs of `bench.analyze --tiny` (the start-up figure): small, and real traces diag reads,
a rank with a measured step each, so that the start-up figure times a whole analysis."""

from __future__ import annotations

import os

from bench.analyze_startup import SIZE, tiny_diag, tiny_kineto
from diag.importers import load_inputs


def test_tiny_inputs_are_2_kb_traces_with_a_step(tmp_path):
    diag_dir, kineto = tiny_diag(str(tmp_path)), tiny_kineto(str(tmp_path))
    assert os.path.getsize(os.path.join(diag_dir, "rank-00000.jsonl")) <= SIZE
    assert SIZE / 2 < os.path.getsize(kineto) <= SIZE
    for path in (diag_dir, kineto):
        trace = load_inputs([path])
        assert trace.ranks == [0] and not trace.steps.dropna(subset=["dur"]).empty, path
