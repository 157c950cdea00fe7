"""Inputs from different runs are never merged: refused with one line naming them (exit 2), or one
report per run with --each-run; ranks of one run (and folders of runs) are still found and joined."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from diag.importers import load_inputs
from diag.importers.runs import MixedRuns
from tests.unit.kineto_synth import Kineto
from tests.unit.synth_trace import Job, two_captures, write_capture
from tests.workloads import launch


def _diag(*args: str) -> subprocess.CompletedProcess[str]:
    return launch.diag_cli("analyze", *args)


def _rank(path, rank: int, world: int, t0: float) -> str:
    """A GPU rank with 6 steps of 100 ms, one NCCL all_reduce each."""
    k = Kineto(rank=rank, world=world, t0=t0)
    for s in range(6):
        base = s * 100_000
        k.step(s, base, 100_000)
        k.kernel("volta_sgemm_128x64_nn", base + 100, 60_000, launch=base + 50)
        k.host(
            "record_param_comms",
            base + 60_100,
            50,
            {"Collective name": "allreduce", "In msg nelems": 1 << 20, "dtype": "Float"},
        )
        k.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", base + 61_000, 30_000, launch=base + 60_120)
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    return k.write(path)


DAY_US = 86_400e6


def test_two_kineto_runs_refused_with_one_line(tmp_path):
    """HTA's trace_diff control (rank 3 of 8) and test (rank 1 of 2) gave 'rank 3 stopped emitting'."""
    a = _rank(tmp_path / "control" / "rank3.json", 3, 8, 1.66e15)
    b = _rank(tmp_path / "test" / "rank1.json", 1, 2, 1.66e15 + 9 * DAY_US)
    r = _diag(a, b)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert "2 different runs" in line and a in line and b in line and "world 8" in line


def test_same_rank_twice_is_two_runs_even_at_the_same_time(tmp_path):
    a = _rank(tmp_path / "base.json", 1, 2, 1.66e15)
    b = _rank(tmp_path / "test.json", 1, 2, 1.66e15)
    with pytest.raises(MixedRuns) as e:
        load_inputs([a, b])
    assert e.value.runs == [[a], [b]]


def test_each_run_gives_one_report_per_run_and_no_desync(tmp_path):
    _rank(tmp_path / "runs" / "a" / "rank0.json", 0, 2, 1.66e15)
    _rank(tmp_path / "runs" / "a" / "rank1.json", 1, 2, 1.66e15 + 2000)
    _rank(tmp_path / "runs" / "b" / "rank0.json", 0, 2, 1.66e15 + DAY_US)
    r = _diag(str(tmp_path / "runs"), "--each-run", "--json")
    assert r.returncode == 0, r.stderr
    docs = [json.loads(d) for d in r.stdout.replace("}\n{", "}\x00{").split("\x00")]
    assert [d["ranks"] for d in docs] == [[0, 1], [0]]
    assert all(f["rule"] not in ("hang_desync", "idle_between_steps") for d in docs for f in d["findings"])
    text = _diag(str(tmp_path / "runs"), "--each-run", "-q").stdout
    assert "== run 1 of 2" in text and "== run 2 of 2" in text
    md = tmp_path / "report.md"
    r = _diag(str(tmp_path / "runs"), "--each-run", "-q", "--markdown", str(md))
    assert r.returncode == 0, r.stderr
    for i in (1, 2):  # a file a run, each named (report.md itself is not written)
        assert (tmp_path / f"report.run{i}.md").stat().st_size
        assert f"diag analyze: run {i}: wrote {tmp_path / f'report.run{i}.md'}\n" in r.stderr
    assert not md.exists()


def test_ranks_of_one_run_in_sub_folders_are_joined(tmp_path):
    """A folder holding a run in a sub-folder (torch's plugins/profile/<date>/ tree) is found."""
    _rank(tmp_path / "job" / "node0" / "rank0.json", 0, 2, 1.66e15)
    _rank(tmp_path / "job" / "node1" / "rank1.json", 1, 2, 1.66e15 + 1500)
    trace = load_inputs([str(tmp_path / "job")])
    assert trace.ranks == [0, 1] and not trace.problems


def test_diag_traces_of_two_runs(tmp_path):
    """Two diag trace dirs: same world, different argv and start (a rerun), are not merged; two
    nodes' dirs of one job (same argv up to --local_rank) are."""

    def job(path, argv: list[str], start_ns: int, ranks: range) -> str:
        j = Job(ranks=len(ranks))
        j.header = {**j.header, "argv": argv, "start_ts": start_ns}
        j.write(str(path))
        for r in ranks:  # renumber: node 1 holds ranks 2, 3
            src = path / f"rank-{r - ranks.start:05d}.jsonl"
            lines = src.read_text().splitlines()
            head = json.loads(lines[0])
            head.update(rank=r, world_size=4)
            lines[0] = json.dumps(head)
            src.unlink()
            (path / f"rank-{r:05d}.jsonl").write_text("\n".join(lines) + "\n")
        return str(path)

    t0 = 1_700_000_000 * 10**9
    node0 = job(tmp_path / "n0", ["train.py", "--local_rank=0", "--lr", "1"], t0, range(0, 2))
    node1 = job(tmp_path / "n1", ["train.py", "--local_rank=1", "--lr", "1"], t0 + 10**9, range(2, 4))
    assert load_inputs([node0, node1]).ranks == [0, 1, 2, 3]
    rerun = job(tmp_path / "rerun", ["train.py", "--local_rank=0", "--lr", "2"], t0, range(2, 4))
    with pytest.raises(MixedRuns):
        load_inputs([node0, rerun])


def test_two_attaches_into_one_directory_are_two_captures(tmp_path):
    """A second attach into the same trace directory writes `rank-N.1.jsonl` beside the first's
    files: a new user's reused ./diag-trace was read as one trace (856 steps but 1,640 all_reduce
    calls a rank, steps colliding), with no word. Now each capture is a run of its own."""
    single = write_capture(str(tmp_path / "single"), 0)
    assert load_inputs([single]).sources == [single]  # one capture: the directory, as before
    one = two_captures(str(tmp_path / "one"))
    res = _diag(one)
    said = f"2 captures in {one} (attaches that wrote into one directory)"
    assert res.returncode == 2 and said in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    each = _diag("--each-run", one)
    assert each.returncode == 0, each.stderr
    first, later = [line for line in each.stdout.splitlines() if line.startswith("== run")]
    assert "rank-00000.jsonl" in first and "rank-00000.1.jsonl" in later  # in the order they came


def test_load_refuses_two_captures_and_reads_the_one_named(tmp_path):
    """`diag.load` of a directory two attaches wrote into read both as one trace (steps collided):
    refused in one line saying how to pick one; `capture=K` reads that capture's files alone."""
    import diag

    one = two_captures(str(tmp_path / "one"), later_steps=3)
    with pytest.raises(diag.DiagError, match=r"holds 2 captures .*diag.load\(path, capture=K\)"):
        diag.load(one)
    assert diag.load(one, capture=0).steps.groupby("rank").size().tolist() == [6, 6]
    assert diag.load(one, capture=1).steps.groupby("rank").size().tolist() == [3, 3]
    with pytest.raises(diag.DiagError, match="no capture 2"):
        diag.load(one, capture=2)
    with pytest.raises(diag.DiagError, match=r"capture must be an integer .* got '1'"):
        diag.load(one, capture="1")  # type: ignore[arg-type]
    # `diag export --perfetto` reads it with `diag.load`: its refusal names its own option
    out = str(tmp_path / "out.json")
    res = launch.diag_cli("export", "--perfetto", out, one)
    assert res.returncode == 2 and "read one with --capture K, K one of 0, 1" in res.stderr, res.stderr
    assert launch.diag_cli("export", "--perfetto", out, "--capture", "1", one).returncode == 0
    res = launch.diag_cli("export", "--prometheus", "127.0.0.1:0", "--capture", "0", one)
    assert res.returncode == 2 and "--prometheus follows the newest capture" in res.stderr, res.stderr
    with open(out, encoding="utf-8") as f:
        assert sum(e.get("cat") == "step" for e in json.load(f)["traceEvents"]) == 2 * 3  # capture 1's


def test_run_or_attach_into_a_directory_holding_a_capture_says_so(tmp_path, monkeypatch, capsys):
    """A second `diag run` or `diag attach` into a trace directory writes rank-N.1.jsonl beside the
    first's files: said in one line on stderr as it starts, not found out at `diag analyze`. Not an
    error; a fresh directory gets no note."""
    import argparse

    from diag.cli import attach
    from diag.inject.attach import Attached

    path = write_capture(str(tmp_path / "t"), 0)
    note = (
        f"note: {path} already holds a capture; this one is written beside it as rank-N.1.jsonl "
        "(read them apart with `diag analyze --each-run`)\n"
    )
    assert launch.diag_cli("run", "--trace-dir", str(tmp_path / "new"), "--", "true").stderr == ""
    res = launch.diag_cli("run", "--trace-dir", path, "--", "true")
    assert res.returncode == 0 and res.stderr == f"diag run: {note}", res.stderr
    monkeypatch.setattr(attach, "rank_targets", lambda pid, _hint: [(pid, 0)])
    parser = argparse.ArgumentParser()
    attach.add_arguments(parser)
    for reused, says in ((False, f"diag attach: {note}"), (True, "")):  # a running agent keeps its file
        found = Attached(123, 0, "ptrace", 0.01, reused=reused)
        monkeypatch.setattr(attach, "attach_one", lambda *_, found=found: found)
        assert attach.run(parser.parse_args(["123", "--trace-dir", path])) == 0
        assert capsys.readouterr().err == says


def test_job_id_tells_runs_apart(tmp_path, monkeypatch):
    from diag.agent.header import job_id

    for var in ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default: no id
    assert job_id() is None
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert job_id() == "SLURM_JOB_ID=4242"

    def run(path, jid: str, ranks: range) -> str:
        j = Job(ranks=2)
        j.header = {**j.header, "argv": ["train.py"], "job_id": jid}
        j.write(str(path))
        if ranks.start:
            for r in (1, 0):
                src = path / f"rank-{r:05d}.jsonl"
                lines = src.read_text().splitlines()
                lines[0] = json.dumps({**json.loads(lines[0]), "rank": r + 2, "world_size": 2})
                src.unlink()
                (path / f"rank-{r + 2:05d}.jsonl").write_text("\n".join(lines) + "\n")
        return str(path)

    a = run(tmp_path / "a", "SLURM_JOB_ID=1", range(0, 2))
    b = run(tmp_path / "b", "SLURM_JOB_ID=2", range(2, 4))  # same argv, times, world: another job
    with pytest.raises(MixedRuns) as e:
        load_inputs([a, b])
    assert "SLURM_JOB_ID=1" in str(e.value) and "SLURM_JOB_ID=2" in str(e.value)


def test_a_diag_trace_and_a_profiler_trace_of_the_same_ranks_are_two_captures(tmp_path):
    """An HF Trainer + DeepSpeed job run under `diag run` with a torch.profiler callback: merged, the
    profiler's ProfilerStep#7-11 (the job's steps 8-12, on the profiler's clock) sat beside the diag
    trace's steps 7-11 (42 steps a rank for 37) and every collective of them counted twice."""
    j = Job(ranks=2)
    j.header = {**j.header, "argv": ["run_clm.py"]}
    trace = j.write(str(tmp_path / "trace"))
    assert trace.ranks == [0, 1]
    profiled = _rank(tmp_path / "kineto" / "rank1.json", 1, 2, 1.66e15)
    with pytest.raises(MixedRuns) as e:
        load_inputs([str(tmp_path / "trace"), profiled])
    assert sorted(e.value.runs) == sorted([[str(tmp_path / "trace")], [profiled]])
    # a profiler trace of a rank the diag trace lacks still joins it
    os.unlink(tmp_path / "trace" / "rank-00001.jsonl")
    joined = load_inputs([str(tmp_path / "trace"), profiled])
    assert joined.ranks == [0, 1] and joined.steps.groupby("rank").size().to_dict() == {0: 8, 1: 6}
