"""The fault matrix's rules on small traces (issue 17): a straggler behind async collectives (DDP),
step-time noise that is no straggler, a stopped rank (hang) and a dead rank (crash) named from its
process and heartbeat, not from silence alone."""

from __future__ import annotations

import pandas as pd

from diag import schema
from tests.unit.synth_trace import MS, Job, fired


def _ddp(slow_ms: float = 60) -> Job:
    """DDP-like: one async bucket all-reduce per step, no blocking collective. Rank 1 issues it
    `slow_ms` late (its own work is longer); rank 0's op lasts until rank 1 arrives."""
    job = Job(steps=10, step_ms=100)
    for s in range(job.steps):
        job.comm(0, s, at_ms=30, dur_ms=5 + slow_ms, async_op=True)
        job.comm(1, s, at_ms=30 + slow_ms, dur_ms=5, async_op=True)
    return job


def test_straggler_behind_async_collectives(tmp_path):
    (f,) = fired(_ddp().write(str(tmp_path / "a")), "straggler")
    assert f.ranks == [1] and abs(f.evidence["others_wait_s"] - 0.060) < 0.002
    assert fired(_ddp(slow_ms=0).write(str(tmp_path / "b")), "straggler") == []


def _blocking_straggler(tmp_path, swing_ms: float, gap_swings: bool) -> list:
    """Rank 1 works 60 ms longer a step, rank 0 waits for it in a blocking all-reduce; every step's
    duration (both ranks alike) swings by -2, -1, 0, 1, 2 x `swing_ms` (robust sigma 1.48 x it), in
    rank 1's own work (the gap swings too: contention) or in both ranks' (a fixed delay)."""
    job = Job(steps=10, step_ms=110)
    swing = [(s % 5 - 2) * swing_ms for s in range(job.steps)]
    for s in range(job.steps):
        job.comm(0, s, at_ms=40, dur_ms=65 + (swing[s] if gap_swings else 0))
        job.comm(1, s, at_ms=100, dur_ms=5)
    trace = job.write(str(tmp_path))
    st = trace.frames["step"]
    trace.frames["step"] = st.assign(dur=pd.to_numeric(st["dur"]) + [swing[s] * MS for s in st["step"]])
    return fired(trace, "straggler")


def test_straggler_needs_a_gap_above_its_noise(tmp_path):
    (f,) = _blocking_straggler(tmp_path / "steady", swing_ms=0, gap_swings=False)
    assert f.ranks == [1] and f.evidence["step_noise_s"] == 0
    # the same 60 ms median gap, steps and gap swinging by up to +-50 ms (sigma 37 ms): contention
    assert _blocking_straggler(tmp_path / "noisy", swing_ms=25, gap_swings=True) == []
    # steps swing but the gap stays 60 ms on every step: a fixed delay, a straggler
    (g,) = _blocking_straggler(tmp_path / "fixed", swing_ms=25, gap_swings=False)
    assert g.ranks == [1]


def _stuck(job: Job, end_ms: float, closed: set[int] = frozenset(), beats_to: dict[int, float] | None = None):
    """Heartbeats (stats) every 2 s up to each rank's `beats_to` ms, and the agent's close marker."""
    for r in range(job.ranks):
        t = 0.0
        while t <= (beats_to or {}).get(r, end_ms):
            job.add(r, schema.STATS, ts=job.start(r, 0) + int(t * MS), captured={}, dropped={}, errors={})
            t += 2000
        if r in closed:
            at = job.start(r, 0) + int(end_ms * MS)
            job.add(r, schema.META, ts=at, key=schema.META_UNFINISHED_AT_DETACH, value=0)


def _hung_job() -> Job:
    """Rank 1 stops after step 5; rank 0 issues step 6's all-reduce, which never completes."""
    job = Job(steps=6, step_ms=100)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=50, dur_ms=5))
    job.comm(0, 6, at_ms=50, dur_ms=5)
    job.events[0][-1]["dur"] = None
    return job


def test_stopped_rank_is_a_hang_naming_it_and_the_collective(tmp_path):
    job = _hung_job()
    _stuck(job, end_ms=12000, beats_to={1: 600})
    trace = job.write(str(tmp_path))
    now = job.start(0, 0) + 12000 * MS
    trace.headers[0]["process"] = {"pid": 1000, "state": "S", "checked_ns": now}
    trace.headers[1]["process"] = {"pid": 1001, "state": "T", "checked_ns": now}
    (f,) = fired(trace, "hang_desync")
    assert f.ranks == [1] and f.evidence["never_arrived"] == [1] and f.evidence["waiting"] == [0]
    ev = f.evidence
    assert (ev["collective"], ev["group"], ev["pending"]) == ("all_reduce", "world", True)
    assert fired(trace, "job_crash") == []
    # the same trace a moment after the stop (peers stalled < 2 s): nothing yet
    for r in (0, 1):
        trace.headers[r]["process"]["checked_ns"] = job.start(0, 6) + 500 * MS
    trace.frames["stats"] = trace.stats[pd.to_numeric(trace.stats["ts"]) <= job.start(0, 6)]
    assert fired(trace, "hang_desync") == []


def _stopped(trace, job: Job) -> None:
    now = job.start(0, 0) + 12000 * MS
    trace.headers[0]["process"] = {"pid": 1000, "state": "S", "checked_ns": now}
    trace.headers[1]["process"] = {"pid": 1001, "state": "T", "checked_ns": now}


def test_hang_step_is_the_one_the_waiting_rank_is_in(tmp_path):
    """Rank 0 ended step 5 and waits in step 6's all-reduce: step 6, whether that call is on disk
    as entered (`comm_open`, the agent's record of a call waited in >= 1.5 s) or not yet (the hang
    named from its last completed call, step 5's: it read as step 5, one below the program's)."""
    job = _hung_job()
    entered = job.events[0].pop()
    _stuck(job, end_ms=12000, beats_to={1: 600})
    trace = job.write(str(tmp_path / "held"))
    _stopped(trace, job)
    (f,) = fired(trace, "hang_desync")
    assert (f.evidence["step"], f.evidence["pending"], f.steps) == (6, False, [6])
    job.add(0, schema.COMM_OPEN, **{k: v for k, v in entered.items() if k not in ("k", "algbw", "busbw")})
    trace = job.write(str(tmp_path / "entered"))
    _stopped(trace, job)
    (f,) = fired(trace, "hang_desync")
    assert (f.evidence["collective"], f.evidence["step"], f.evidence["pending"]) == ("all_reduce", 6, True)


def _slow_hang(tmp_path, name: str, entered_at_ms: float | None, after_ms: float) -> list:
    """Steps of 2.5 s (FSDP2 on CPU); rank 1 stopped after step 5; rank 0, `after_ms` after step 6
    began, has its step-6 all-reduce on disk as entered (`comm_open`) at `entered_at_ms` into step
    6 (None: not on disk)."""
    job = Job(steps=6, step_ms=2500)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=50, dur_ms=5))
    if entered_at_ms is not None:
        job.comm(0, 6, at_ms=entered_at_ms, dur_ms=0)
        open_rec = job.events[0].pop()
        job.add(0, schema.COMM_OPEN, **{k: open_rec[k] for k in schema.FIELDS[schema.COMM]} | {"dur": None})
    _stuck(job, end_ms=6 * 2501 + after_ms, beats_to={1: 5 * 2501})
    trace = job.write(str(tmp_path / name))
    now = job.start(0, 6) + int(after_ms * MS)
    trace.headers[0]["process"] = {"pid": 1000, "state": "S", "checked_ns": now}
    trace.headers[1]["process"] = {"pid": 1001, "state": "T", "checked_ns": now}
    return fired(trace, "hang_desync")


def test_a_hang_in_slow_steps_is_named_within_6_s_when_the_peers_wait_in_a_call(tmp_path):
    """5 median steps are 12.5 s here; a call entered in the current step and never completed caps
    the stall at 6 s. Without that call on disk, or one from an earlier step, 5 median steps."""
    (f,) = _slow_hang(tmp_path, "entered", entered_at_ms=50, after_ms=6500)
    assert f.ranks == [1] and (f.evidence["step"], f.evidence["pending"]) == (6, True)
    assert f.evidence["stalled_s"] < 7 and "issued_ns" not in f.evidence
    assert _slow_hang(tmp_path, "early", entered_at_ms=50, after_ms=5000) == []
    assert _slow_hang(tmp_path, "not_on_disk", entered_at_ms=None, after_ms=6500) == []
    (g,) = _slow_hang(tmp_path, "not_on_disk_later", entered_at_ms=None, after_ms=13000)
    assert g.ranks == [1]


def test_post_mortem_hang_from_the_heartbeat(tmp_path):
    """Everything killed in the end (no close): rank 1's heartbeat ended 10 s before rank 0's."""
    job = _hung_job()
    _stuck(job, end_ms=12000, beats_to={1: 600})
    (f,) = fired(job.write(str(tmp_path)), "hang_desync")
    assert f.ranks == [1] and f.evidence["how"] == {1: "silent"}


def test_dead_rank_named_from_its_missing_process(tmp_path):
    job = _hung_job()
    _stuck(job, end_ms=1200, closed={0}, beats_to={1: 600})
    trace = job.write(str(tmp_path))
    # post-mortem, its peer closed 0.6 s later: a kill or a crash of the peer's making? not said
    assert fired(trace, "job_crash") == [] and fired(trace, "hang_desync") == []
    now = job.start(0, 0) + 1500 * MS
    trace.headers[0]["process"] = {"pid": 1000, "state": "gone", "checked_ns": now}
    trace.headers[1]["process"] = {"pid": 1001, "state": "gone", "checked_ns": now}
    (f,) = fired(trace, "job_crash")
    assert f.ranks == [1] and f.evidence["how"] == {1: "gone"} and f.evidence["collective"] == "all_reduce"
    assert fired(trace, "hang_desync") == []


def test_a_dead_ranks_wait_status_is_named_not_guessed(tmp_path):
    """The watcher read rank 1's status while it was a zombie (SIGKILL: 9): live from its look, and
    post-mortem from the looks `diag watch` kept (`proc` records); never rank 0's SIGTERM."""
    job = _hung_job()
    _stuck(job, end_ms=1200, closed={0}, beats_to={1: 600})
    trace = job.write(str(tmp_path))
    now = job.start(0, 0) + 1500 * MS
    trace.headers[0]["process"] = {"pid": 1000, "state": "gone", "checked_ns": now, "exit": 15}
    trace.headers[1]["process"] = {"pid": 1001, "state": "gone", "checked_ns": now, "exit": 9}
    (f,) = fired(trace, "job_crash")
    assert f.title.startswith("job crashed: rank 1 died (SIGKILL) after step"), f.title
    assert f.evidence["ended_by"] == {1: "SIGKILL"} and "killed by SIGKILL." in f.detail
    trace.headers[1]["process"] = {"pid": 1001, "state": "gone", "checked_ns": now}  # not read
    (g,) = fired(trace, "job_crash")
    assert "ended_by" not in g.evidence and "(SIGKILL)" not in g.title and "the OOM killer" in g.detail
    trace.frames[schema.PROC] = pd.DataFrame(
        {"rank": -1, "of_rank": [1, 1, 0], "ts": [now - 2, now - 1, now], "exit": [None, 139 - 128, 15]}
    )
    (h,) = fired(trace, "job_crash")
    assert h.evidence["ended_by"] == {1: "SIGSEGV"} and "(SIGSEGV)" in h.title


def test_killed_rank_is_a_crash_not_a_desync_when_every_process_is_gone(tmp_path):
    """A live run: rank 1 killed (its last collectives never flushed: it looks behind in its group),
    rank 0 waited in the next bucket's all-reduce (heartbeat at 2 s) until the launcher ended it, no close:
    every process is gone. A crash of rank 1 (its records end first), no hang or desync."""
    job = _hung_job()
    job.comm(0, 6, at_ms=60, dur_ms=5, nbytes=1 << 10)  # the next bucket, another size
    job.events[0][-1]["dur"] = None
    _stuck(job, end_ms=2000, beats_to={0: 2000, 1: 0})
    trace = job.write(str(tmp_path))
    now = job.start(0, 0) + 2100 * MS
    for r in (0, 1):
        trace.headers[r]["process"] = {"pid": 1000 + r, "state": "gone", "checked_ns": now}
    assert fired(trace, "hang_desync") == []
    (f,) = fired(trace, "job_crash")
    assert f.ranks == [1] and f.evidence["how"] == {1: "gone"} and f.evidence["collective"] == "all_reduce"
    # both ranks' records end within 0.5 s of each other: who died first is not known, nothing said
    trace.frames["stats"] = trace.stats[trace.stats["rank"] == 1]
    assert fired(trace, "job_crash") == [] and fired(trace, "hang_desync") == []


def test_dead_rank_post_mortem_when_peers_waited_for_it(tmp_path):
    """Its peer's heartbeat went on 10 s (stuck in the collective), then closed: rank 1 died."""
    job = _hung_job()
    _stuck(job, end_ms=10600, closed={0}, beats_to={1: 600})
    (f,) = fired(job.write(str(tmp_path)), "job_crash")
    assert f.ranks == [1] and f.evidence["how"] == {1: "silent"}


def test_live_ranks_a_flush_apart_are_not_behind(tmp_path):
    """A running job read between two flushes: rank 1's last 2 steps not written yet, both running."""
    job = Job(steps=8, step_ms=30)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=20, dur_ms=2))
    trace = job.write(str(tmp_path))
    trace.frames["step"] = trace.steps[(trace.steps["rank"] == 0) | (trace.steps["step"] < 6)]
    assert len(fired(trace, "hang_desync")) == 1  # a finished trace: behind is behind
    now = job.start(0, 8)
    for r in (0, 1):
        trace.headers[r]["process"] = {"pid": 1000 + r, "state": "R", "checked_ns": now}
    assert fired(trace, "hang_desync") == []


def test_live_collectives_a_flush_apart_are_no_desync(tmp_path):
    """A running ZeRO-2 job, rank 1 throttled (stopped 40 ms of every 100 ms): its newest collectives
    are not written (issued) yet while rank 0's next ones, of another size, are; the ranks still
    complete collectives: no desync. A real one, no collective completing while both ranks'
    heartbeats go on for seconds, is still named."""
    job = Job(steps=8, step_ms=100)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=20, dur_ms=5))
    for at in (40, 60):  # rank 0's next collectives: the reduce-scatter of another bucket
        job.comm(0, 7, op="reduce_scatter", nbytes=1 << 12, at_ms=at, dur_ms=5)
    _stuck(job, end_ms=800)
    trace = job.write(str(tmp_path))
    now = job.start(0, 7) + 70 * MS
    for r in (0, 1):
        trace.headers[r]["process"] = {"pid": 1000 + r, "state": "R", "checked_ns": now}
    assert fired(trace, "hang_desync") == []
    # the same divergence with both ranks' heartbeats 4 s on (waiting in different collectives)
    for r in (0, 1):
        job.add(r, schema.STATS, ts=job.start(0, 7) + 4000 * MS, captured={}, dropped={}, errors={})
    trace = job.write(str(tmp_path / "stuck"))
    for r in (0, 1):
        trace.headers[r]["process"] = {"pid": 1000 + r, "state": "S", "checked_ns": now + 4000 * MS}
    (f,) = fired(trace, "hang_desync")
    assert f.ranks == [0, 1] and f.evidence["diverged_groups"]


def _killed_all_at_once(tmp_path, name: str, others_on_s: float) -> list:
    """A 2-rank diag trace with heartbeats whose rank 1 lost its last 8 steps (its last 0.2 s flush,
    never written: the job was SIGTERMed all at once); rank 0's process went on `others_on_s` after
    rank 1's last record (its heartbeat says so)."""
    job = Job(steps=40, step_ms=10)
    job.each_step(lambda r, s: job.comm(r, s, at_ms=5, dur_ms=1) if not (r == 1 and s >= 32) else None)
    for r in (0, 1):
        job.add(r, schema.STATS, ts=job.start(r, 0), captured=1, dropped=0, errors=0)
    end1 = job.start(1, 32)
    job.add(1, schema.STATS, ts=end1, captured=2, dropped=0, errors=0)
    job.add(0, schema.STATS, ts=max(job.start(0, 40), end1 + int(others_on_s * 1000 * MS)), captured=2)
    trace = job.write(str(tmp_path / name))
    trace.frames["step"] = trace.steps[(trace.steps["rank"] != 1) | (trace.steps["step"] < 32)]
    return fired(trace, "hang_desync")


def test_a_job_killed_all_at_once_is_no_hang(tmp_path):
    """Post-mortem, a public DDP program SIGTERMed while healthy read as 'ranks fell behind ([1])':
    the killed ranks' unflushed last records differ by steps, not by time. Behind only if the
    others' processes went on, quiet, for max(2 s, 5 median steps) after it."""
    assert _killed_all_at_once(tmp_path, "end", others_on_s=0.05) == []
    (f,) = _killed_all_at_once(tmp_path, "hang", others_on_s=5.0)
    assert f.evidence["behind"] == [1]


def _input_stalled(lead1_ms: float) -> Job:
    """Layers recorded every step; rank 1 idles `lead1_ms` before its first forward (its data loader),
    then works as long as rank 0, which waits for it in the step's blocking all-reduce."""
    job = Job(steps=10, step_ms=200)
    for s in range(job.steps):
        for r in (0, 1):
            t = job.start(r, s) + int((lead1_ms if r == 1 else 0) * MS)
            job.add(r, schema.LAYER, step=s, module="blocks.0", phase="fwd", ts=t + MS, dur=60 * MS, flops=0)
            job.add(
                r, schema.LAYER, step=s, module="blocks.0", phase="bwd", ts=t + 62 * MS, dur=40 * MS, flops=0
            )
        job.comm(0, s, at_ms=105, dur_ms=5 + lead1_ms)
        job.comm(1, s, at_ms=105 + lead1_ms, dur_ms=5)
    return job


def test_an_input_stall_is_idle_between_steps_not_also_a_straggler(tmp_path):
    """The fault matrix's input-stall cell: the straggler rule counted rank 1's data-loader lead-in as
    its own work ('2.87x the others' compute time') beside idle_between_steps' finding on the same
    rank; one fault, one finding."""
    trace = _input_stalled(80).write(str(tmp_path / "stall"))
    assert fired(trace, "straggler") == []
    (f,) = fired(trace, "idle_between_steps")
    assert f.ranks == [1]
    assert fired(_input_stalled(0).write(str(tmp_path / "even")), "idle_between_steps") == []
