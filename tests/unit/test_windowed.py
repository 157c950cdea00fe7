"""`metrics.windowed`: the figures of a trace read a window of steps at a time equal `Metrics`' of
the whole trace, on every diag sample and fixture, windows of 1, 2, 3, 7 steps and one larger than
the job, and a tiled trace. The windows are made as the lock-step reader's contract says: window k
is the trace's records of steps lo..lo+W-1 (`Window.frames`), records of no step column in every
window, and one `outside` trace of the step-carrying records no window holds."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from diag.metrics import windowed
from diag.metrics.stage import Metrics
from diag.trace.lockstep import LockStep, OutOfStep
from diag.trace.model import Trace
from diag.trace.reader import load_trace
from diag.trace.window import Window
from tests.conftest import sample_folders

DIAG_DIRS = [d for d in sample_folders() if any(f.endswith(".jsonl") for f in os.listdir(d))]
SIZES_ON = ("zero3", "megatron_tp2", "straggler")  # every size on these


def figures(trace: Trace, size: int) -> windowed.Figures:
    windows, outside = windowed.split(trace, size)
    acc = windowed.Windowed()
    for w in windows:
        acc.add(w)
    return acc.done(outside)


def assert_same(trace: Trace, got: windowed.Figures) -> None:
    m = Metrics(trace)
    for name in (
        "steps",
        "steady_steps",
        "step_times",
        "exposed",
        "blocked",
        "stragglers",
        "breakdown",
        "overlap",
        "step_split",
    ):
        pd.testing.assert_frame_equal(getattr(got, name), getattr(m, name), obj=name)
    assert got.median_step_s == m.median_step_s
    pd.testing.assert_frame_equal(got.collectives, m.collectives, check_exact=True, obj="collectives")
    every = m.select()  # all calls, reduced: per (rank, step) their count and seconds
    for how, want in (("size", every.counts), ("sum", every.sums)):
        pd.testing.assert_series_equal(got.calls_per_step(how), want, check_names=False, obj=how)
    pd.testing.assert_frame_equal(got.comm_per_step(), m.comm_per_step(), obj="comm_per_step")
    pd.testing.assert_frame_equal(got.union_per_step(), m.union_per_step(), obj="union_per_step")
    assert got.attributed == 0


# every folder at size 3 end to end (`test_read_gives_the_whole_traces_figures`: the lock-step
# reader's windows); each size here on a few, the windows cut from the whole read
CASES = [(d, size) for d in DIAG_DIRS if os.path.basename(d) in SIZES_ON for size in (1, 2, 3, 7, 10_000)]


@pytest.mark.parametrize(
    ("path", "size"), CASES, ids=lambda v: os.path.basename(v) if isinstance(v, str) else str(v)
)
def test_windows_give_the_whole_traces_figures(path, size):
    trace = load_trace(path)
    assert_same(trace, figures(trace, size))


@pytest.mark.parametrize("name", ["zero3", "megatron_tp2"])
def test_busbw_of_a_bus_factor_no_binary_fraction_gives_the_same(name):
    """A group of 20 ranks: an all_reduce's bus factor 2 x 19 / 20 = 1.9 is no binary fraction, so
    each call's bytes x 1.9 summed window by window differed from the whole read's sum in the last
    bits (a real 20-rank DDP job's busbw, `diag analyze --windowed`): the whole bytes are summed per
    factor and multiplied once."""
    trace = load_trace(os.path.join("sample_traces", name))
    trace.frames["comm"]["group_size"] = 20
    m = Metrics(trace)
    got = figures(trace, 1)
    pd.testing.assert_frame_equal(got.collectives, m.collectives, check_exact=True)


def test_a_tiled_trace_gives_the_whole_traces_figures(tmp_path):
    """bench.analyze's input (the real ZeRO-3 run tiled, 4 ranks x 12 steps) in windows of 5."""
    from bench.analyze import make_diag_input

    make_diag_input(str(tmp_path), 4, 12)
    trace = load_trace(str(tmp_path / "traces"))
    assert_same(trace, figures(trace, 5))


def _with_comms(trace: Trace, c: pd.DataFrame) -> Trace:
    frames = dict(trace.frames)
    frames["comm"] = c.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)
    return Trace(headers=trace.headers, frames=frames)


def late_member(path: str, steps: int = 3) -> Trace:
    """A trace whose rank 1 made no call in its first `steps` steps (an attach that reached it
    late): its groups have one member in the first windows, two in the whole trace."""
    trace = load_trace(path)
    c = trace.comms
    step = pd.to_numeric(c["step"])
    first = int(step[c["rank"] == 1].min())
    return _with_comms(trace, c[~((c["rank"] == 1) & (step < first + steps)).to_numpy()])


@pytest.mark.parametrize("size", [1, 3])
@pytest.mark.parametrize("name", ["zero3", "straggler"])
def test_a_group_that_gains_a_member_later_is_carried(name, size):
    """The early steps' positions had one member: their transfer time is unknown (NaN) and their
    arrivals are not counted in the whole trace, though each early window alone knows them."""
    trace = late_member(os.path.join("sample_traces", name))
    m = Metrics(trace)
    assert m.exposed["exposed_s"].isna().any()  # (what the carry must reproduce)
    assert_same(trace, figures(trace, size))


def test_calls_before_the_first_step_are_left_out_as_whole():
    """Calls of step -1 before every step (outside every window): the whole trace attributes them
    by time (none lies in a step: dropped) and `stragglers` places them as a step of their own."""
    trace = load_trace(os.path.join("sample_traces", "zero3"))
    c = trace.comms
    step = pd.to_numeric(c["step"])
    early = c[(step == step.min()).to_numpy()].assign(step=-1, ts=lambda d: d["ts"] - 10**10)
    trace = _with_comms(trace, pd.concat([c, early], ignore_index=True))
    got = figures(trace, 2)
    assert len(windowed.split(trace, 2)[1].comms) == len(early)
    assert_same(trace, got)


def straddling() -> Trace:
    """zero3 with rank 0's last call of step 2 running on 10 ms into step 3 (a record of an
    earlier window in a later step) and rank 1's first call of step 4 starting 50 ms into step 3
    (a record of the next window in an earlier step); step 3 is the sampled one."""
    trace = load_trace(os.path.join("sample_traces", "zero3"))
    c, st = trace.comms.copy(), trace.steps.set_index(["rank", "step"])["ts"]
    step = pd.to_numeric(c["step"])
    last = c.index[(c["rank"] == 0) & (step == 2)][-1]
    c.loc[last, "dur"] = st[(0, 3)] + 10_000_000 - c.loc[last, "ts"]
    first = c.index[(c["rank"] == 1) & (step == 4)][0]
    c.loc[first, "ts"] = st[(1, 3)] + 50_000_000
    return _with_comms(trace, c)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_calls_lying_in_a_step_of_another_window_are_split_there(size):
    trace = straddling()
    plain = load_trace(os.path.join("sample_traces", "zero3"))
    assert not Metrics(trace).step_split.equals(Metrics(plain).step_split)  # (they lie in step 3)
    assert_same(trace, figures(trace, size))


@pytest.mark.parametrize("name", ["zero3", "megatron_tp2"])
def test_windows_read_each_on_its_own_give_the_same(name):
    """Each window read by `load_trace(path, window=...)`, as the lock-step reader gives it: its
    text columns categoricals of its own values, not the whole trace's."""
    path = os.path.join("sample_traces", name)
    trace = load_trace(path)
    windows, outside = windowed.split(trace, 2)
    acc = windowed.Windowed()
    for lo in range(0, len(windows) * 2, 2):
        acc.add(load_trace(path, window=Window(None, lo, lo + 2)))
    assert_same(trace, acc.done(outside))


def test_a_sampled_step_without_a_span_is_not_split_on():
    """zero3 with rank 0's sampled step 3 of no duration: it is no step, so rank 0's row reads
    all its steady steps (none is sampled), the ones after step 3 too."""
    trace = load_trace(os.path.join("sample_traces", "zero3"))
    st = trace.steps.copy()
    st.loc[(st["rank"] == 0) & (st["step"] == 3), "dur"] = float("nan")
    frames = {**trace.frames, "step": st}
    trace = Trace(headers=trace.headers, frames=frames)
    assert Metrics(trace).step_split.set_index("rank").loc[0, "basis"] == "all steps"
    assert_same(trace, figures(trace, 1))


@pytest.mark.parametrize("folder", DIAG_DIRS, ids=os.path.basename)
def test_read_gives_the_whole_traces_figures(folder):
    """End to end: the rank files read forward together a window at a time (`trace.lockstep`),
    each window reduced (`Windowed`): the figures of `Metrics` on the trace read whole."""
    assert_same(load_trace(folder), windowed.read(folder, 3))


@pytest.mark.parametrize("name", ["zero3", "megatron_tp2"])
def test_read_one_step_at_a_time(name):
    """Windows of one step: the first step's records all lack a duration (null: the agent started
    within it), so that window's column holds only None; joined, it takes the others' dtype."""
    path = os.path.join("sample_traces", name)
    assert_same(load_trace(path), windowed.read(path, 1))


def test_read_out_of_step_reads_whole(tmp_path):
    """A record of a window already given (a layer record written after `ahead` later records):
    the trace is read whole and split, with the same figures."""
    src = os.path.join("sample_traces", "zero3")
    for name in os.listdir(src):
        with open(os.path.join(src, name)) as f:
            lines = f.readlines()
        if name == "rank-00000.jsonl":
            late = next(i for i, line in enumerate(lines) if '"k": "layer"' in line or '"k":"layer"' in line)
            lines.append(lines.pop(late))
        (tmp_path / name).write_text("".join(lines))
    with pytest.raises(OutOfStep):
        for _ in LockStep(str(tmp_path), 3, ahead=8):
            pass
    assert_same(load_trace(str(tmp_path)), windowed.read(str(tmp_path), 3, ahead=8))


@pytest.mark.parametrize("name", ["zero3", "straggler", "megatron_tp2"])
def test_parts_folded_as_windows_come_give_the_same(name, monkeypatch):
    """Windows of one step with every held part joined each 2 windows (FOLD, 32 in use: no sample
    has that many windows): the folds keep the parts' order, so the figures are the same. Each
    rank's steps split on their own (a chunk a rank: no sample fills one), the same split."""
    from diag.metrics import positions, split_windows

    trace = load_trace(os.path.join("sample_traces", name))
    whole = Metrics(trace).step_split
    monkeypatch.setattr(positions, "CHUNK_ROWS", 1)
    pd.testing.assert_frame_equal(Metrics(trace).step_split, whole)
    monkeypatch.setattr(split_windows, "FOLD", 2)
    monkeypatch.setattr(windowed, "FOLD", 2)
    assert len(windowed.split(trace, 1)[0]) > 4
    assert_same(trace, figures(trace, 1))
