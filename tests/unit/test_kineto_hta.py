"""Our temporal breakdown and overlap equal Holistic Trace Analysis' on the same GPU-shaped traces.

HTA only defines these figures for GPU kernels, so the comparison runs on the committed
`gpu-rank*.json.gz` (a real gloo run re-expressed as CUDA traces; see generate_kineto.py).
"""

from __future__ import annotations

import logging
import shutil

import pytest

from diag.importers import load_inputs
from diag.metrics import breakdown
from tests.unit.kineto_samples import GPU_RANKS

hta = pytest.importorskip("hta.trace_analysis", reason="holistictraceanalysis (the bench extra) absent")
pytestmark = pytest.mark.filterwarnings("ignore")  # HTA's own pandas deprecation warnings


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu")
    for p in GPU_RANKS:
        shutil.copy(p, folder)
    logging.disable(logging.WARNING)
    try:
        theirs = hta.TraceAnalysis(trace_dir=str(folder))
    finally:
        logging.disable(logging.NOTSET)
    return load_inputs([str(folder)]), theirs


def test_temporal_breakdown_matches_hta(both):
    ours, theirs = both
    want = theirs.get_temporal_breakdown(visualize=False).set_index("rank")
    got = breakdown.temporal_breakdown(ours).set_index("rank")
    assert list(got.index) == list(want.index) == [0, 1]
    for col in ("idle", "compute", "non_compute"):
        assert got[f"{col}_ns"].tolist() == (want[f"{col}_time(us)"] * 1000).tolist()
        assert got[f"{col}_pct"].tolist() == pytest.approx(want[f"{col}_time_pctg"].tolist(), abs=0.01)
    assert (got["compute_pct"] > 0).all() and (got["idle_pct"] > 0).all()


def test_overlap_matches_hta(both):
    ours, theirs = both
    want = theirs.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
    got = breakdown.comm_overlap(ours).set_index("rank")["overlap_pct"]
    assert got.tolist() == pytest.approx(want.tolist(), abs=0.01)
