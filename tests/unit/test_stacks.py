"""Clustering rank stacks and the hang verdict, on py-spy's JSON shape and a real trace file."""

from __future__ import annotations

from diag.stacks.cluster import cluster, collective_of, odd_ones_out
from diag.stacks.dump import rank_stack
from diag.stacks.join import Progress, describe, progress, verdict
from diag.trace.writer import TraceFileWriter

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"
TRAIN = "/job/train.py"


def thread(*frames: tuple[str, str, int], name: str = "MainThread") -> dict:
    return {
        "thread_name": name,
        "thread_id": 1,
        "frames": [{"name": n, "filename": f, "line": ln} for n, f, ln in frames],
    }


IN_ALL_REDUCE = [
    ("all_reduce", C10D, 3252),
    ("wrapper", LOGGER, 83),
    ("step", TRAIN, 40),
    ("main", TRAIN, 60),
]
IN_LOADER = [("next_batch", TRAIN, 22), ("main", TRAIN, 58)]


def stacks(*per_rank):
    return [
        rank_stack(100 + r, r, [thread(*frames), thread(("run", "/x/threading.py", 1), name="w")])
        for r, frames in enumerate(per_rank)
    ]


def test_collective_named_from_innermost_library_frame():
    st = stacks(IN_ALL_REDUCE)[0]
    assert collective_of(st.frames) == "all_reduce"
    assert collective_of(stacks(IN_LOADER)[0].frames) is None
    assert "w" in st.other_threads and st.thread == "MainThread"


def test_identical_stacks_group_and_the_odd_rank_is_named():
    sts = stacks(IN_ALL_REDUCE, IN_ALL_REDUCE, IN_LOADER, IN_ALL_REDUCE)
    groups = cluster(sts)
    assert [[s.rank for s in g.ranks] for g in groups] == [[0, 1, 3], [2]]
    assert [s.rank for s in odd_ones_out(groups)] == [2]
    assert odd_ones_out(cluster(stacks(IN_ALL_REDUCE, IN_LOADER))) == []  # 1 vs 1: no majority


def test_verdict_names_stuck_rank_collective_and_absent_rank():
    sts = stacks(IN_ALL_REDUCE, IN_LOADER)
    progs = {100: Progress(5, "all_reduce", 4), 101: Progress(5, "all_reduce", 4)}
    text = verdict(sts, progs)
    assert text == (
        "rank 0 stuck in all_reduce (collective #6 since diag started); never arrived: "
        "rank 1 (in next_batch (train.py:22))"
    )
    assert "waiting in all_reduce (its collective #6" in describe(sts[0], progs[100])
    assert verdict(stacks(IN_LOADER, IN_LOADER), {}) is None


def test_verdict_names_the_group_and_step_and_a_collective_issued_from_cpp():
    """Issue 17: the hang verdict names the collective's group and step. DDP's reducer issues its
    all-reduce from C++: rank 0's stack shows `backward`, no collective; its trace's pending record
    (issued, never completed) says which one it waits in."""
    in_backward = [("backward", "/venv/lib/python3.11/site-packages/torch/_tensor.py", 581), *IN_LOADER]
    sts = stacks(in_backward, IN_LOADER)
    stuck = Progress(120, "all_reduce", 56, "world:0", ("all_reduce", "world:0", 57))
    behind = Progress(119, "all_reduce", 56, "world:0")
    assert verdict(sts, {100: Progress(120, "all_reduce", 56, "world:0"), 101: behind}) is None
    text = verdict(sts, {100: stuck, 101: behind})
    assert text == (
        "rank 0 stuck in all_reduce (group world:0, step 57, collective #121 since diag started); "
        "never arrived: rank 1 (in next_batch (train.py:22))"
    )
    assert "waiting in all_reduce (issued from C++, per its trace)" in describe(sts[0], stuck)
    on_stack = verdict(stacks(IN_ALL_REDUCE, IN_LOADER), {100: Progress(5, "all_reduce", 4, "tp:12")})
    assert on_stack is not None and "(after all_reduce in group tp:12 at step 4, collective #6" in on_stack


def test_verdict_reports_ranks_in_different_collectives():
    broadcast = [("broadcast", C10D, 2800), *IN_ALL_REDUCE[1:]]
    assert "different collectives" in (verdict(stacks(IN_ALL_REDUCE, broadcast), {}) or "")


def test_progress_counts_completed_collectives_in_a_trace(tmp_path):
    w = TraceFileWriter(str(tmp_path), "rank-00000.jsonl")
    ops = ["broadcast", "all_reduce"]
    w.write_objects(
        [
            {"k": "header", "rank": 0},
            *({"k": "comm", "op": op, "step": i, "dur": 1000} for i, op in enumerate(ops)),
            {"k": "step", "step": 1},
            # issued, never completed (written when the agent gave up waiting): not counted
            {"k": "comm", "op": "all_gather", "step": 2, "dur": None},
        ]
    )
    w.close()
    assert progress(w.path) == Progress(2, "all_reduce", 1, pending=("all_gather", None, 2))


def test_progress_reads_a_call_still_waited_in(tmp_path):
    """A `comm_open` record (a call waited in >= 1.5 s) is the pending one until its `comm` record
    is written; then that record says whether it completed."""
    w = TraceFileWriter(str(tmp_path), "rank-00000.jsonl")
    done = {"op": "all_reduce", "step": 4, "group": "world:0", "ts": 10}
    w.write_objects(
        [
            {"k": "header", "rank": 0},
            {"k": "comm", **done, "dur": 1000},
            {"k": "comm_open", "op": "all_reduce", "step": 5, "group": "world:0", "ts": 20, "dur": None},
        ]
    )
    w.close()
    assert progress(w.path) == Progress(1, "all_reduce", 4, "world:0", ("all_reduce", "world:0", 5))
    w = TraceFileWriter(str(tmp_path), "rank-00001.jsonl")
    w.write_objects(
        [
            {"k": "header", "rank": 1},
            {"k": "comm_open", **done, "dur": None},
            {"k": "comm", **done, "dur": 1000},
        ]
    )
    w.close()
    assert progress(w.path) == Progress(1, "all_reduce", 4, "world:0", None)


def test_diag_frames_are_not_on_the_stacks():
    """Issue 9: diag's comms `Work.wait` and the overflow wrapper were shown, even as a rank's
    location; they hid the collective too."""
    from diag.collectors import overflow
    from diag.collectors.comms import timing as comms_timing

    waiting = [
        ("wait", comms_timing.__file__, 127),
        ("all_reduce", C10D, 3252),
        ("wrapper", LOGGER, 83),
        ("step", TRAIN, 40),
        ("main", TRAIN, 60),
    ]
    st = stacks(waiting, [("wrapper", overflow.__file__, 40), *IN_LOADER])
    assert collective_of(st[0].frames) == "all_reduce"
    assert [fr.name for fr in st[1].frames] == ["next_batch", "main"]
    assert "overflow" not in describe(st[1], None)


def test_no_verdict_while_ranks_make_progress():
    """Issue 9: "rank 1 stuck in all_reduce; never arrived: rank 0" and "different collective
    counts" on a healthy job: one sample caught rank 0 between collectives, counts read apart."""
    from diag.stacks.join import moving

    first = stacks(IN_ALL_REDUCE, IN_LOADER)
    second = stacks(IN_ALL_REDUCE, IN_LOADER)
    counts = {100: Progress(78697, "all_reduce", 9), 101: Progress(79059, "all_reduce", 9)}
    later = {100: Progress(78705, "all_reduce", 9), 101: Progress(79059, "all_reduce", 9)}
    assert verdict(second, later)  # one sample alone would cry wolf
    assert moving((first, counts), (second, later)) == ["rank 0 +8 collectives"]
    polled = stacks(IN_ALL_REDUCE, [("next_batch", TRAIN, 23), ("main", TRAIN, 58)])
    assert moving((first, counts), (polled, counts)) == []  # a line number alone: polling in place
    assert moving((first, {}), (stacks(IN_LOADER, IN_LOADER), {})) == ["rank 0 moved"]


def test_py_spy_failure_names_the_error_line_not_the_backtrace_tail():
    from diag.stacks.dump import _reason

    stderr = (
        "thread 'main' panicked at src/python_spy.rs:80: failed to copy memory\n"
        "stack backtrace:\n   9: py_spy::main\n  10: main\n"
    )
    assert _reason(stderr).startswith("thread 'main' panicked")
    assert _reason("Error: Permission denied (os error 13)\n") == "Error: Permission denied (os error 13)"
    assert _reason("") == "failed"


def test_dump_of_a_process_that_is_gone_fails_once_with_one_line():
    import subprocess
    import sys

    import pytest

    from diag.errors import DiagError
    from diag.stacks.dump import dump

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    with pytest.raises(DiagError) as e:
        dump(p.pid)
    assert "\n" not in str(e.value) and str(p.pid) in str(e.value)


def test_dump_of_a_stopped_process_reads_its_stack(tmp_path):
    """Issue 17: py-spy cannot suspend a SIGSTOPped process ("Failed to get stack traces"), so
    `diag stacks` gave up on exactly the rank that hangs; a stopped process is read without suspending."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from diag.stacks.dump import dump, stopped

    script = tmp_path / "wait_here.py"
    script.write_text(
        "import time\ndef wait_here():\n    print('ready', flush=True)\n    while True:\n"
        "        time.sleep(0.05)\nwait_here()\n"
    )
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        os.kill(p.pid, signal.SIGSTOP)
        while not stopped(p.pid):
            time.sleep(0.01)
        st = rank_stack(p.pid, None, dump(p.pid))
        assert "wait_here" in [f.name for f in st.frames]
    finally:
        p.kill()
        p.wait()


def test_stacks_of_a_process_that_runs_no_python_says_so_in_one_line():
    """py-spy's own words for a non-Python pid ("Failed to find python version from target process")
    were passed on as they came; `diag stacks` says what `diag attach` says, and exits non-zero."""
    import subprocess
    import sys

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        res = subprocess.run(
            [sys.executable, "-m", "diag", "stacks", str(sleeper.pid), "--interval", "0"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    assert res.returncode != 0 and res.stderr.strip().count("\n") == 0, res.stderr
    assert f"pid {sleeper.pid} is not a Python process (" in res.stderr, res.stderr
    assert "Failed to find python version" not in res.stderr


def test_render_names_odd_ones_out_only_beside_a_verdict():
    """A healthy pipeline job's dump (3 ranks in an all-reduce, stage 0's rank in compute) headed
    "odd one(s) out: rank 0" while its verdict said no rank waits on a missing peer."""
    from diag.cli.stacks import render

    sts = stacks(IN_ALL_REDUCE, IN_LOADER, IN_ALL_REDUCE, IN_ALL_REDUCE)
    healthy = render(sts, {}, None, all_threads=False)
    assert "odd one" not in healthy and "verdict: no rank is waiting on a missing peer" in healthy
    stuck = render(sts, {}, "rank 0 stuck in all_reduce; never arrived: rank 1", all_threads=False)
    assert "odd one(s) out: rank 1" in stuck
