"""The view model against pandas: the numbers `diag top` shows equal those computed from
`diag.load` of the same real trace; the tailer and the sources behave on growing files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import diag
from diag import schema
from diag.errors import DiagError
from diag.metrics import steps as step_frames
from diag.metrics.layer_stats import steady_samples
from diag.tui import fmt
from diag.tui.model import JobModel
from diag.tui.source import LiveSource, ReplaySource, trace_dir_of_pid
from diag.tui.tail import DirTail
from diag.tui.view import build_view
from tests.conftest import ROOT
from tests.unit.synth_trace import write_capture


def _view(path):
    m = JobModel()
    src = ReplaySource(path, speed=0)
    m.ingest(src.poll())
    return m, build_view(m)


def test_ranks_and_steps_match_pandas(real_trace):
    tr = diag.load(real_trace)
    _, v = _view(real_trace)
    assert v.ranks == len(tr.ranks) >= 2
    steps = tr.steps.dropna(subset=["dur"])
    job = steps.groupby("step")["dur"].max() / 1e6
    assert v.step_series == pytest.approx(list(job.values[-60:]))
    assert v.last_step == job.index[-1] and v.last_ms == pytest.approx(job.iloc[-1])
    for row in v.rank_rows:
        mine = steps[steps["rank"] == row.rank].sort_values("ts").iloc[-1]
        assert (row.step, row.step_ms) == (mine["step"], pytest.approx(mine["dur"] / 1e6))
        comm = tr.comms[(tr.comms["rank"] == row.rank) & (tr.comms["step"] == mine["step"])]
        assert row.comm_share == pytest.approx(min(1.0, comm["dur"].sum() / mine["dur"]))
        mem = tr.memory[tr.memory["rank"] == row.rank]
        peak = mem["peak"].max() if mem["peak"].notna().any() else mem["rss"].max()
        assert row.mem_peak == peak


def test_collectives_layers_overflow_match_pandas(real_trace):
    tr = diag.load(real_trace)
    _, v = _view(real_trace)
    c = tr.comms
    factor = [schema.bus_factor(str(o), int(n or 0)) for o, n in zip(c["op"], c["group_size"])]
    c = c.assign(bus=c["bytes"] * factor)
    expect = (
        {  # per rank: every member rank records each collective of its group
            (str(g), str(o)): (
                len(d) / d["rank"].nunique(),
                d["bytes"].sum() / d["rank"].nunique(),
                d["bus"].sum() / d["dur"].sum(),
            )
            for (g, o), d in c.groupby(["group", "op"], observed=True)
        }
        if len(c)
        else {}
    )
    got = {(r.group, r.op): (r.per_rank_count, r.per_rank_bytes, r.busbw) for r in v.comm_rows}
    assert got.keys() == expect.keys()
    for k, (n, b, bw) in expect.items():
        assert got[k][:2] == (n, b) and got[k][2] == pytest.approx(bw)
    # over the steady samples, as `diag analyze`'s top layers: the warm-up step's are left out
    lay = steady_samples(tr.layers, step_frames.steady(step_frames.step_frame(tr.steps)))
    assert len(lay) < len(tr.layers) and not lay["warmup"].any(), (
        "the trace samples a warm-up and a steady step"
    )
    per_step = len(lay[["rank", "step"]].drop_duplicates())
    totals = lay.groupby("module", observed=True)["dur"].sum() / per_step / 1e6
    assert v.layer_rows, "the real trace has layer events"
    for row in v.layer_rows:
        assert row.ms_per_step == pytest.approx(totals[row.module])
    names = [r.module for r in v.layer_rows]
    assert any("wte" in n or "embed" in n for n in names) and any("head" in n for n in names)
    assert not any(n == "module" or ("." not in n and n[:1].isupper()) for n in names)
    over = tr.overflow
    bad = sorted(over[over["overflow"].astype(bool)]["step"].unique())
    assert [r["step"] for r in v.overflow_rows if r["ranks"]] == sorted(bad, reverse=True)
    rank0 = over[over["rank"] == min(tr.ranks)].sort_values("ts")
    if len(rank0):  # fp16 traces (the recorded one forces an overflow at step 3)
        assert v.loss_scale == rank0["scale_after"].iloc[-1]
        assert v.skipped_steps == over["skipped_steps"].max()
    else:
        assert v.loss_scale is None and not v.overflow_rows


def test_to_trace_feeds_the_analyzers(real_trace):
    m, _ = _view(real_trace)
    tr = m.to_trace()
    loaded = diag.load(real_trace)
    assert len(tr.steps) == len(loaded.steps) and tr.ranks == loaded.ranks


def test_tailer_partial_lines_and_late_files(tmp_path):
    f0 = tmp_path / "rank-00000.jsonl"
    f0.write_text(json.dumps({"k": "header", "rank": 0, "pid": 1}) + "\n" + '{"k": "step", "st')
    tail = DirTail(str(tmp_path))
    first = tail.poll()
    assert first[0].header["rank"] == 0 and first[0].events == []
    with open(f0, "a") as f:
        f.write('ep": 1, "ts": 5, "dur": 7}\nnot json\n')
    (tmp_path / "rank-00001.jsonl").write_text(json.dumps({"k": "header", "rank": 1}) + "\n")
    chunks = {os.path.basename(c.path): c for c in tail.poll()}
    assert chunks["rank-00000.jsonl"].events == [{"k": "step", "step": 1, "ts": 5, "dur": 7}]
    assert chunks["rank-00000.jsonl"].skipped == 1
    assert chunks["rank-00001.jsonl"].header["rank"] == 1
    assert tail.poll() == []


def test_a_later_capture_is_followed_alone(tmp_path):
    """A second attach into the directory `diag top` follows writes `rank-N.1.jsonl`: read with the
    first's files, rank 0 counted both captures' steps; now the newest alone, and the summary says so."""
    path = write_capture(str(tmp_path / "t"), 0)
    m, src = JobModel(), LiveSource(path)
    m.ingest(src.poll())
    assert m.ranks[0].step_count == 6 and "following" not in src.describe()
    write_capture(path, 1, steps=3)
    m.ingest(src.poll())
    assert m.ranks[0].step_count == 3 and "following capture 1, the newest" in src.describe()


def test_replay_releases_records_by_their_time(real_trace):
    clock = [0.0]
    src = ReplaySource(real_trace, speed=2.0, clock=lambda: clock[0])
    everything = sum(len(c.events) for c in ReplaySource(real_trace, speed=0).poll())
    first = src.poll()
    assert {os.path.basename(c.path) for c in first if c.header} >= {"rank-00000.jsonl"}
    got = sum(len(c.events) for c in first)
    assert got < everything
    span = (src.last_ts - src.first_ts) / 1e9
    clock[0] = span / 4  # half the trace at speed 2
    half = sum(len(c.events) for c in src.poll())
    assert 0 < got + half < everything and not src.done
    src.paused = True
    clock[0] = 10 * span
    assert src.poll() == []
    src.paused = False
    src.poll()
    clock[0] = 20 * span
    src.poll()
    assert src.done


def test_pid_resolution(tmp_path):
    (tmp_path / "rank-00000.jsonl").write_text(json.dumps({"k": "header", "rank": 0}) + "\n")
    code = "import time; time.sleep(30)"
    env = {**os.environ, "DIAG_TRACE_DIR": str(tmp_path)}
    with_dir = subprocess.Popen([sys.executable, "-c", code], env=env)
    without = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=str(tmp_path),
        env={k: v for k, v in os.environ.items() if k != "DIAG_TRACE_DIR"},
    )
    try:
        assert trace_dir_of_pid(with_dir.pid) == str(tmp_path)
        with pytest.raises(DiagError, match="is not attached"):
            trace_dir_of_pid(without.pid)
    finally:
        for p in (with_dir, without):
            p.kill()
            p.wait()
    with pytest.raises(DiagError, match="no such process"):
        trace_dir_of_pid(with_dir.pid)
    with pytest.raises(DiagError, match="no such trace directory"):
        LiveSource(str(tmp_path / "nope"))


def test_top_and_analyze_report_the_same_busbw(real_trace):
    """`diag top` (per rank, group and op) and `diag analyze` (per rank and op) show one busbw: bus
    bytes over total time. Once top averaged per-call figures, which the many one-element flag
    reductions drag far from what the report says."""
    from diag.analyzers import run_all

    from diag.report import model

    tr = diag.load(real_trace)
    doc = model.build(tr, *run_all(tr))
    analyze = {(r["rank"], r["op"]): r["busbw"] for r in doc["metrics"]["collectives"]}
    m, _ = _view(real_trace)
    compared = per_call_differs = 0
    for rank, stats in m.rank_comms.items():
        for (group, op), stat in stats.items():
            if sum(1 for g, o in stats if o == op) > 1:
                continue  # analyze's row sums the op over the rank's groups
            assert stat.busbw == pytest.approx(analyze[(rank, op)], rel=1e-9), (rank, group, op)
            mine = tr.comms[(tr.comms["rank"] == rank) & (tr.comms["op"].astype(str) == op)]
            per_call_differs += mine["busbw"].mean() != pytest.approx(stat.busbw, rel=1e-3)
            compared += 1
    assert compared >= 4 and per_call_differs >= 1  # the old mean would have failed here


def test_collectives_panel_counts_a_groups_collective_once_as_analyze_does(real_trace):
    """A collective of a group is one operation each member rank records: the panel added every
    rank's records (2-rank DDP: all_reduce 122 and 1.5 GiB where each rank ran 61 of 12.7 MiB,
    as `diag analyze` and Prometheus say). It shows calls and bytes per rank, and says so."""
    from diag.analyzers import run_all

    from diag.report import model
    from diag.tui import rows

    tr = diag.load(real_trace)
    doc = model.build(tr, *run_all(tr))
    analyze = {(r["rank"], r["op"]): (r["calls"], r["bytes"]) for r in doc["metrics"]["collectives"]}
    m, v = _view(real_trace)
    cells = rows.comm_rows(v)
    assert rows.COMM_COLUMNS[2:4] == ("calls per rank", "bytes per rank")
    compared = 0
    for c in v.comm_rows:
        if sum(1 for g, o in m.comms if o == c.op) > 1:
            continue  # analyze's row sums the op over the rank's groups
        assert len(c.ranks) == tr.comms[tr.comms["group"].astype(str) == c.group]["rank"].nunique() >= 2
        for rank in c.ranks:
            assert (c.per_rank_count, c.per_rank_bytes) == analyze[(rank, c.op)], (rank, c.group, c.op)
        row = cells[f"{c.group} / {c.op}"]
        assert row[2:4] == (
            str(analyze[(min(c.ranks), c.op)][0]),
            fmt.nbytes(analyze[(min(c.ranks), c.op)][1]),
        )
        compared += 1
    assert compared >= 2


def test_overflow_tab_keeps_every_overflowed_step_on_a_long_run():
    """The Overflow tab counted steps from the recent loss-scale events only: after 200 more of them
    it said 'steps with an overflow 0' while each rank's health still said 'overflow 5'."""
    trace = os.path.join(os.path.dirname(__file__), "..", "..", "sample_traces", "fp16_overflow")
    m, _ = _view(trace)
    skipped = sorted(int(s) for s in diag.load(trace).overflow.query("overflow == True")["step"].unique())
    for step in range(12, 12 + 150):  # a long healthy tail: two loss-scale records per step
        for rank in (0, 1):
            m.add(
                rank,
                {
                    "k": schema.OVERFLOW,
                    "step": step,
                    "ts": 0,
                    "overflow": False,
                    "scale_before": 8.0,
                    "scale_after": 8.0,
                    "skipped_steps": 5,
                    "source": "deepspeed_fp16",
                },
            )
    v = build_view(m)
    assert {r.health for r in v.rank_rows} == {"overflow 5"}
    assert v.overflow_steps == len(skipped) == 5
    assert sorted(r["step"] for r in v.overflow_rows if r["ranks"]) == skipped
    assert all(sorted(r["ranks"]) == [0, 1] for r in v.overflow_rows if r["ranks"])


def test_ranks_tab_names_the_straggler_the_findings_tab_names():
    """The straggler rule flags rank 1 (it sleeps before each batch; rank 0 waits for it in the
    collectives, so their step times look alike): Ranks said 'ok' for it while Findings named it."""
    from diag.tui.pump import FindingsUpdated, Pump, ViewUpdated, run_analyzers

    posted = []
    trace = os.path.join(os.path.dirname(__file__), "..", "..", "sample_traces", "straggler")
    pump = Pump(
        ReplaySource(trace, speed=0), posted.append, interval=0.01, analyze=run_analyzers, analyze_every=0
    )
    pump.poll_once()
    before = [m.view for m in posted if isinstance(m, ViewUpdated)][-1]
    assert "straggler" not in {r.health for r in before.rank_rows}  # step times alone do not show it
    pump.maybe_analyze()
    named = {
        r
        for m in posted
        if isinstance(m, FindingsUpdated)
        for f in m.findings
        if f.rule == "straggler"
        for r in f.ranks
    }
    pump.poll_once()
    after = {r.rank: r.health for r in [m.view for m in posted if isinstance(m, ViewUpdated)][-1].rank_rows}
    assert named == {1} and after[1].startswith("straggler") and "straggler" not in after[0]
    analyses = pump.analyses
    pump.maybe_analyze()  # the verdict is not new data: no second analysis
    assert pump.analyses == analyses


def test_header_and_health_say_when_the_followed_job_ended(tmp_path):
    """After the job's processes exit, the header said 'live' and every rank 'ok'."""
    import socket as _socket

    from diag.tui import jobstate
    from diag.tui.pump import Pump, ViewUpdated
    from diag.tui.rows import summary_text

    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(tmp_path / "rank-00000.jsonl", "w") as f:
            f.write(
                json.dumps(
                    {
                        "k": "header",
                        "schema": 1,
                        "rank": 0,
                        "world_size": 1,
                        "pid": job.pid,
                        "host": _socket.gethostname(),
                    }
                )
                + "\n"
            )
            f.write(
                json.dumps(
                    {
                        "k": schema.STEP,
                        "step": 1,
                        "ts": 1,
                        "dur": 5_000_000,
                        "samples": 8,
                        "tokens": None,
                        "applied": True,
                    }
                )
                + "\n"
            )
        posted = []
        pump = Pump(LiveSource(str(tmp_path)), posted.append, interval=0.01, analyze=None, analyze_every=60)
        pump.poll_once()
        view = [m.view for m in posted if isinstance(m, ViewUpdated)][-1]
        assert view.state == "live" and view.rank_rows[0].health == "ok"
        job.kill()
        job.wait()
        pump._state_at -= jobstate.EVERY_S  # the next poll checks again
        pump.poll_once()
        view = [m.view for m in posted if isinstance(m, ViewUpdated)][-1]
        assert view.state == "ended" and view.rank_rows[0].health == "ended"
        assert summary_text(view, pump.source.describe()).startswith(f"ENDED: {tmp_path}")
    finally:
        job.kill()
        job.wait()


def test_sparkline_has_a_scale(real_trace):
    """The sparkline of step times had no scale: the line above it names its range and its steps."""
    from diag.tui.rows import spark_scale, summary_text

    _, v = _view(real_trace)
    lo, hi = min(v.step_series), max(v.step_series)
    assert lo < hi
    line = spark_scale(v)
    assert f"last {len(v.step_series)} step(s)" in line and f"{lo:.1f} to {hi:.1f} ms" in line
    assert summary_text(v, "replay x").splitlines()[-1] == line


def test_refused_files_reach_the_view(tmp_path):
    (tmp_path / "rank-00000.jsonl").write_text(json.dumps({"k": "header", "schema": 1, "rank": 0}) + "\n")
    os.mkfifo(tmp_path / "rank-00001.jsonl")
    m = JobModel()
    m.ingest(DirTail(str(tmp_path)).poll())
    assert build_view(m).refused == ["rank-00001.jsonl: a FIFO, not a regular file: refused"]
    assert build_view(m).ranks == 1


def test_header_shows_the_megatron_layout_and_named_groups(tmp_path):
    """A real megatron-core TP=2 job's records (header, then the layout and groups as meta, as the
    agent writes them): the header line names TP/PP/DP, the batch and the process groups' roles."""
    from diag.tui.rows import summary_text

    recs = {
        r: [
            {"k": "header", "schema": 1, "rank": r, "world_size": 2, "host": "vm", "pid": 1 + r},
            {
                "k": "meta",
                "ts": 1,
                "key": "groups",
                "value": {
                    "tp:12": {"role": "tp", "size": 2, "ranks": [0, 1]},
                    "world:0": {"role": "world", "size": 2, "ranks": [0, 1]},
                },
            },
            *({"k": "meta", "ts": 3, "key": k, "value": v} for k, v in (("tp", 2), ("pp", 1), ("dp", 1))),
            {"k": "meta", "ts": 4, "key": "micro_batch", "value": 4},
        ]
        for r in (0, 1)
    }
    for r, lines in recs.items():
        (tmp_path / f"rank-{r:05d}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    m = JobModel()
    m.ingest(DirTail(str(tmp_path)).poll())
    line = summary_text(build_view(m), "live x").splitlines()[0]
    assert "TP=2 PP=1 DP=1" in line and "micro-batch 4" in line and "groups tp(2)" in line, line
    assert "world" not in line


def test_header_shows_the_sequence_parallel_degree(tmp_path):
    """Megatron-DeepSpeed with DeepSpeed-Ulysses (`--ds-sequence-parallel-size 2`, 2 ranks): the
    header read `2 ranks, TP=1 PP=1 DP=1`, no SP; the agent now writes `sp` as it writes `tp`."""
    from diag.tui.rows import summary_text

    meta = (("dp", 1), ("pp", 1), ("sp", 2), ("tp", 1))
    recs = [
        {"k": "header", "schema": 1, "rank": 0, "world_size": 2, "host": "vm", "pid": 1},
        *({"k": "meta", "ts": 3, "key": k, "value": v} for k, v in meta),
    ]
    (tmp_path / "rank-00000.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    m = JobModel()
    m.ingest(DirTail(str(tmp_path)).poll())
    assert "TP=1 PP=1 DP=1 SP=2" in summary_text(build_view(m), "live x").splitlines()[0]


def test_analyses_are_spaced_by_their_own_cost(tmp_path):
    """At 1,024 ranks the rules cost 2.4 CPU s: run every 10 s they took a quarter of a core and held
    up the refreshes. The next analysis waits `ANALYSIS_SHARE` times the latest one's CPU time
    when that is longer than `analyze_every`."""
    from diag.tui.pump import ANALYSIS_SHARE, Pump, run_analyzers
    from tests.tui.synth import SynthJob

    job = SynthJob(str(tmp_path), 64, slow_rank=3)
    for step in (0, 1):
        job.write_step(step)
    pump = Pump(LiveSource(str(tmp_path)), [].append, interval=0.01, analyze=run_analyzers, analyze_every=0)
    pump.poll_once()
    pump.maybe_analyze()
    assert pump.analyses == 1 and pump._analysis_cpu > 0
    job.write_step(2)
    pump.poll_once()
    pump.maybe_analyze()  # new data and analyze_every 0, but sooner than 10x the last one's cost
    assert pump.analyses == 1
    pump._last_analysis -= ANALYSIS_SHARE * pump._analysis_cpu
    pump.maybe_analyze()
    assert pump.analyses == 2
    job.close()


def test_samples_per_second_is_the_jobs_rate_as_analyze_gives_it():
    """A DeepSpeed step's samples are the global batch (micro x accumulation x dp), the same on
    every rank: the header's samples/s multiplied them by dp again (2 ranks: twice the rate)."""
    from diag.analyzers import run_all

    from diag.report import model
    from diag.tui.view import MEAN_OVER

    path = os.path.join(ROOT, "sample_traces", "zero3")
    tr = diag.load(path)
    steps = [s for s in model.build(tr, *run_all(tr))["steps"] if s["samples_per_s"]][-MEAN_OVER:]
    secs = [s["max_ms"] / 1e3 for s in steps]  # the job's step: its slowest rank's
    job = sum(s["samples_per_s"] * t for s, t in zip(steps, secs)) / sum(secs)
    _, v = _view(path)
    assert len(steps) == 5 and v.samples_per_s == pytest.approx(job, rel=1e-6)


def test_layers_show_the_warm_up_only_until_a_steady_step_is_sampled(real_trace):
    """Early in a run the only sample is the first step's: shown (a panel with something in it)
    until a steady step's sample arrives, then left out, as in `diag analyze`."""
    from diag.tui.tail import Chunk
    from diag.tui.view import leaf_layer_rows

    events: dict[str, list[dict]] = {}
    headers: dict[str, dict] = {}
    for name in sorted(os.listdir(real_trace)):
        if name.startswith("rank-") and name.endswith(".jsonl"):
            path = os.path.join(real_trace, name)
            with open(path) as f:
                rows = [json.loads(line) for line in f]
            headers[path], events[path] = rows[0], rows[1:]
    later = max(int(e["step"]) for evs in events.values() for e in evs if e["k"] == schema.LAYER)
    m = JobModel()
    m.ingest(
        [
            Chunk(p, headers[p], [e for e in evs if int(e.get("step") or 0) < later])
            for p, evs in events.items()
        ]
    )
    early = {r.module: r.ms_per_step for r in leaf_layer_rows(m)}
    assert early and not m.layers, "only warm-up samples so far: they are what the panel shows"
    m.ingest(
        [Chunk(p, None, [e for e in evs if int(e.get("step") or 0) >= later]) for p, evs in events.items()]
    )
    steady = {r.module: r.ms_per_step for r in leaf_layer_rows(m)}
    assert steady.keys() == early.keys() and steady != early
    assert {s for _, s in m.layer_rank_steps} == {later}
