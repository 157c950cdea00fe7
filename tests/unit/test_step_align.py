"""Steps counted from each rank's attach put on one numbering (`trace.step_align`): a public 2-rank
DDP program attached 8 times had rank 1's numbers 2 below to 1 above rank 0's for the same
iteration, and the per-step table and `hang_desync` compared different iterations."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

import diag
from diag import schema
from diag.trace import step_align
from tests.unit.synth_trace import MS, Job, fired


def _attached(tmp_path, late: dict[int, int], origins: dict[int, str] | None = None, skew_ms: float = 0.0):
    """A 2-rank lockstep job of 12 steps, each rank's records numbered from its attach: rank r
    attached `late[r]` steps in (its earlier records dropped, the rest renumbered from 0); rank 1's
    clock `skew_ms` off."""
    job = Job(ranks=2, steps=12, step_ms=20.0)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=10, dur_ms=2))
    path = str(tmp_path / "t")
    job.write(path)
    for rank in range(2):
        name = os.path.join(path, f"rank-{rank:05d}.jsonl")
        with open(name) as f:
            recs = [json.loads(line) for line in f]
        head = {**recs[0], "step_origin": (origins or {}).get(rank, step_align.ATTACH)}
        kept = []
        for rec in recs[1:]:
            if rec["step"] >= late.get(rank, 0):
                rec["step"] -= late.get(rank, 0)
                rec["ts"] += int(skew_ms * MS) * rank
                kept.append(rec)
        with open(name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in [head, *kept])
    return path


def _by_time(trace) -> dict[int, set[int]]:
    """Each step number's ranks' start times: one time a step where the ranks agree."""
    st = trace.steps
    return {int(s): set(g["ts"]) for s, g in st.groupby("step")}


def test_a_rank_attached_later_is_numbered_as_the_first(tmp_path):
    trace = diag.load(_attached(tmp_path, {1: 2}))
    assert trace.headers[1][step_align.OFFSET_KEY] == 2 and step_align.OFFSET_KEY not in trace.headers[0]
    assert all(len(times) == 1 for times in _by_time(trace).values())  # one iteration a number
    assert sorted(trace.steps.loc[trace.steps["rank"] == 1, "step"]) == list(range(2, 12))
    comm = trace.frame(schema.COMM)
    assert sorted(comm.loc[comm["rank"] == 1, "step"]) == list(range(2, 12))  # its calls with it


def test_the_rank_attached_first_moves_up_and_no_step_is_negative(tmp_path):
    trace = diag.load(_attached(tmp_path, {0: 3}))
    assert trace.headers[0][step_align.OFFSET_KEY] == 3
    assert trace.steps["step"].min() == 0 and all(len(t) == 1 for t in _by_time(trace).values())


def test_a_job_counted_step_numbering_is_kept(tmp_path):
    """Rank 0 numbered by the job (the optimizer's count): rank 1 takes its numbers."""
    trace = diag.load(_attached(tmp_path, {0: 0, 1: 4}, origins={0: "optimizer"}))
    assert step_align.OFFSET_KEY not in trace.headers[0] and trace.headers[1][step_align.OFFSET_KEY] == 4


def test_ranks_not_in_lockstep_keep_their_numbers(tmp_path):
    """Ends half a step apart match no offset: nothing is shifted (the premise is not measured)."""
    trace = diag.load(_attached(tmp_path, {1: 2}, skew_ms=10.5))
    assert not any(step_align.OFFSET_KEY in h for h in trace.headers.values())
    assert sorted(trace.steps.loc[trace.steps["rank"] == 1, "step"]) == list(range(10))


def test_ranks_detached_at_their_own_moments_are_not_behind(tmp_path):
    """Rank 0 detached at step 7, rank 1 ran on to step 11 before its own detach took (a stopped
    rank resumed): no rank fell behind. Without the detach marker the premise holds: a finding."""
    job = Job(ranks=2, steps=12, step_ms=20.0)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=10, dur_ms=2))
    path = str(tmp_path / "t")
    job.write(path)
    name = os.path.join(path, "rank-00000.jsonl")
    with open(name) as f:
        recs = [json.loads(line) for line in f]
    with open(name, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs if r.get("step", 0) <= 7)
    assert fired(diag.load(path), "hang_desync")  # (the premise: behind, told by its steps alone)
    for rank in range(2):
        with open(os.path.join(path, f"rank-{rank:05d}.jsonl"), "a") as f:
            meta = {"k": "meta", "ts": 0, "key": schema.META_UNFINISHED_AT_DETACH, "value": 0}
            f.write(json.dumps(meta) + "\n")
    assert fired(diag.load(path), "hang_desync") == []


def test_the_windowed_pass_reads_such_a_trace_whole(tmp_path, capsys):
    """Windows are cut by step numbers: those of ranks counted from their attach are aligned on the
    whole trace, which the windowed pass then reads (said on stderr), to the same document."""
    from diag.cli import main

    path = _attached(tmp_path, {1: 2})
    assert main(["analyze", path, "--json", "--no-windowed"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(["analyze", path, "--json", "--windowed"]) == 0
    out = capsys.readouterr()
    assert "reading the trace whole" in out.err and "attach" in out.err
    assert json.loads(out.out) == whole
    assert whole["layout"]["step_offsets"] == {"1": 2}  # the report says which numbers moved
    assert main(["analyze", path, "--no-windowed"]) == 0
    assert "aligned by their ends (rank 1 +2)" in " ".join(capsys.readouterr().out.split())


def test_ranks_counted_alike_from_their_start_are_still_read_a_window_at_a_time(tmp_path, capsys):
    """`diag run` of a plain loop: every rank counts from its own start, the same numbers (a public
    DDP program's 4 x 22,400 steps): nothing to renumber, so the windowed pass reads it."""
    from diag.cli import main

    path = _attached(tmp_path, {})
    assert main(["analyze", path, "--json", "--windowed"]) == 0
    err = capsys.readouterr().err
    assert "reading the trace whole" not in err and "steps at a time" in err


def _ends_copied(steps):
    """`step_align._ends` as it was made before it copied only the columns it reads."""
    import numpy as np
    import pandas as pd

    st = steps[pd.to_numeric(steps["step"], errors="coerce") >= 0]
    end = pd.to_numeric(st["ts"], errors="coerce") + pd.to_numeric(st["dur"], errors="coerce")
    st = st.assign(end=end).dropna(subset=["end"]).sort_values(["rank", "end"], kind="stable")
    return {
        int(rank): (g["end"].to_numpy(dtype=float), g["step"].to_numpy(dtype=np.int64))
        for rank, g in st.groupby("rank", sort=True)
    }


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # rank
            st.one_of(st.none(), st.integers(-1, 6)),  # step
            st.integers(0, 50),  # ts
            st.one_of(st.none(), st.integers(0, 9)),  # dur
        ),
        min_size=1,
        max_size=30,
    )
)
def test_ends_are_what_the_copying_version_gave(rows):
    """Steps outside every step (-1) or of none, durations missing, equal ends: the same arrays."""
    import numpy as np
    import pandas as pd

    steps = pd.DataFrame(rows, columns=["rank", "step", "ts", "dur"])
    got, want = step_align._ends(steps), _ends_copied(steps)
    assert list(got) == list(want)
    for rank, (end, step) in want.items():
        assert np.array_equal(got[rank][0], end) and np.array_equal(got[rank][1], step)
