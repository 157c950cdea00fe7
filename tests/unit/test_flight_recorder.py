"""PyTorch Flight Recorder dumps: read safely (pickle without globals, or JSON) and the hang diagnosed.

tests/fixtures/fr holds real dumps of a 3-rank CPU/gloo job (`make_dumps.py`: torch 2.13 records gloo
collectives with TORCH_FR_BUFFER_SIZE set; `_dump_fr_trace[_json]()` writes what
TORCH_NCCL_DEBUG_INFO_TEMP_FILE gets on a timeout). torch's own fr_trace says of the same dumps (after
keying their `pg_config` by '0': on gloo it is keyed '' and fr_trace 2.13 stops with KeyError ('0', 0)):
behind -> "Not all ranks joining collective, sequence number: 4 ... gloo:all_reduce, missing ranks: {2},
input sizes: [[1024]]"; optype -> "Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH". A size
mismatch has no real dump (gloo aborts the process first): it is a real dump with one size changed."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
from diag.analyzers import run_all

from diag.importers import load_inputs
from diag.importers.errors import ImportProblem
from diag.importers.flight_recorder import load
from tests.unit.kineto_samples import ROOT

FR = os.path.join(os.path.dirname(__file__), "..", "fixtures", "fr")


def _desync(path: str) -> list:
    found, failures = run_all(load_inputs([path]))
    assert failures == {}
    return [f for f in found if f.rule == "collective_desync"]


@pytest.mark.parametrize("folder", ["healthy", "json/healthy"])
def test_healthy_dumps_are_silent(folder):
    trace = load_inputs([os.path.join(FR, folder)])
    assert trace.problems == [] and trace.ranks == [0, 1, 2]
    assert len(trace.frame("fr_entry")) == 12  # 4 collectives x 3 ranks
    assert run_all(trace)[0] == []


@pytest.mark.parametrize("folder", ["behind", "json/behind"])
def test_rank_behind_and_the_collective_the_others_wait_in(folder):
    (f,) = _desync(os.path.join(FR, folder))
    ev = f.evidence
    assert f.severity == "critical" and f.ranks == [2]
    assert ev["behind"] == {2: 3} and ev["last_seq"] == {0: 4, 1: 4, 2: 3}
    w = ev["waiting_in"]
    assert (w["seq"], w["op"], w["input_sizes"], w["dtypes"], w["ranks"]) == (
        4,
        "all_reduce",
        [[1024]],
        ["Float"],
        [0, 1],
    )
    # the job's own line, from the pickle's stack frames (torch's JSON form carries none)
    assert w["called_at"].endswith("make_dumps.py:39 work") if folder == "behind" else w["called_at"] == ""
    assert "mismatch" not in ev and ev["members"] == [0, 1, 2] and ev["missing_dumps"] == []


@pytest.mark.parametrize("folder", ["optype", "json/optype"])
def test_collective_type_mismatch(folder):
    (f,) = _desync(os.path.join(FR, folder))
    mm = f.evidence["mismatch"]
    assert (mm["seq"], mm["state"]) == (4, "COLLECTIVE_TYPE_MISMATCH") and f.ranks == [1]
    assert mm["differ"] == [
        {
            "ranks": [1],
            "op": "broadcast",
            "in_sizes": "[[1024]]",
            "out_sizes": "[[1024]]",
            "in_dtypes": '["Float"]',
            "out_dtypes": '["Float"]',
        }
    ]
    assert mm["majority"]["ranks"] == [0, 2] and mm["majority"]["op"] == "all_reduce"


def test_size_mismatch(tmp_path):
    for r in range(3):
        dump = json.loads(open(os.path.join(FR, "json", "healthy", f"nccl_trace_rank_{r}.json")).read())
        if r == 2:
            (e,) = [e for e in dump["entries"] if e["collective_seq_id"] == 3]
            e["input_sizes"] = e["output_sizes"] = [[512]]
        (tmp_path / f"nccl_trace_rank_{r}.json").write_text(json.dumps(dump))
    (f,) = _desync(str(tmp_path))
    mm = f.evidence["mismatch"]
    assert (mm["seq"], mm["state"], f.ranks) == (3, "SIZE_OR_SYNTAX_MISMATCH", [2])
    assert mm["differ"][0]["in_sizes"] == "[[512]]" and mm["majority"]["in_sizes"] == "[[1024]]"


def test_a_member_without_a_dump_is_named(tmp_path):
    for r in (0, 1):
        shutil.copy(os.path.join(FR, "healthy", f"nccl_trace_rank_{r}"), tmp_path)
    (f,) = _desync(str(tmp_path))
    assert f.evidence["missing_dumps"] == [2] and f.severity == "warning" and f.ranks == [2]


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_pickle_with_code_is_refused_and_never_run(tmp_path):
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [_Evil()]}))
    with pytest.raises(ImportProblem, match=r"refused (posix|os)\.system"):
        load(str(path))
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2 and not (tmp_path / "PWNED").exists()
    assert r.stderr.strip().count("\n") == 0 and "Flight Recorder" in r.stderr and "Traceback" not in r.stderr


def test_two_dumps_of_one_rank(tmp_path):
    shutil.copy(os.path.join(FR, "healthy", "nccl_trace_rank_0"), tmp_path / "a_rank_0")
    shutil.copy(os.path.join(FR, "json", "healthy", "nccl_trace_rank_0.json"), tmp_path)
    trace = load_inputs([str(tmp_path)])
    assert [str(p) for p in trace.problems] == [
        f"{tmp_path / 'nccl_trace_rank_0.json'}: a second Flight Recorder dump for rank 0 (skipped)"
    ]


def test_dumps_written_now_by_this_torch(tmp_path):
    """The generator run live: this torch's own dump of a hang gives the same diagnosis."""
    torch = pytest.importorskip("torch")
    import torch._C._distributed_c10d as c10d

    if not hasattr(c10d, "_dump_fr_trace"):
        pytest.skip(f"torch {torch.__version__} has no _dump_fr_trace")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    subprocess.run(
        [sys.executable, os.path.join(FR, "make_dumps.py"), str(tmp_path), "behind"],
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    (f,) = _desync(str(tmp_path / "behind"))
    assert f.evidence["behind"] == {2: 3} and f.evidence["waiting_in"]["seq"] == 4
