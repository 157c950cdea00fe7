"""Step times from the HF Trainer's tqdm bar: its rates are moving averages (smoothing 0.3); each
display's own step time is recovered from the rate and the counts (`diag.importers.logs.tqdm_times`)."""

from __future__ import annotations

import io
import os

import pytest
from diag.analyzers import run_all

from diag.importers import load_inputs
from diag.importers.logs import import_log

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures")
TOTAL = "  Total optimization steps = {}\n"  # the Trainer's start-up block: which bar is training's


def test_bar_step_times_are_the_traces_step_times():
    """The real 1-rank run of tests/fixtures/hf_1rank_bar: the log alone said 420 ms for step 2 (the
    bar's average still holding step 1's 667 ms) where its trace measured 256 ms."""
    log = import_log(os.path.join(FIX, "hf_1rank_bar", "job.log")).frames["log_step"].set_index("step")
    trace = load_inputs([os.path.join(FIX, "hf_1rank_bar", "rank-00000.jsonl")]).steps.set_index("step")
    both = log.join(trace["dur"], how="inner").dropna(subset=["iter_ms", "dur"])
    assert list(both.index) == list(range(2, 31))
    ratio = both["iter_ms"] / (both["dur"] / 1e6)
    # each step within 5% (step 2: 247.6 ms vs 256.1: the bar and the engine's step end apart), the
    # median within 1%
    assert ratio.between(0.95, 1.05).all() and abs(ratio.median() - 1) < 0.01, ratio.round(3).to_dict()


def _tqdm_log(step_s: list[float]) -> str:
    """What the Trainer's bar prints (real tqdm, its defaults) for steps of these seconds."""
    tqdm = pytest.importorskip("tqdm", reason="the bar is drawn by real tqdm (a DeepSpeed dependency)")
    clock = [0.0]
    out = io.StringIO()
    bar = tqdm.tqdm(total=len(step_s), file=out, ascii=False)
    bar._time = lambda: clock[0]  # a step's seconds pass on this clock, not the host's
    bar.reset(total=len(step_s))
    for s in step_s:
        clock[0] += s
        bar.update(1)
    bar.close()
    return out.getvalue()


def test_one_slow_step_is_one_slow_record_not_a_drop(tmp_path):
    """A checkpoint save makes one step 5x slower. The bar's average spread it over the next steps
    (2.2x, 1.84x, 1.59x the median): three records >= 1.5x, a 'throughput drop' that never was."""
    steps = [1.0] * 40
    steps[20] = 5.0
    path = tmp_path / "job.log"
    path.write_text(TOTAL.format(40) + _tqdm_log(steps) + "{'train_runtime': 44.0, 'train_loss': 2.5}\n")
    st = import_log(str(path)).frames["log_step"].set_index("step")
    assert list(st.index) == list(range(1, 41))
    # within the rounding of the printed rate (3 digits), which the inversion multiplies by ~5
    assert st["iter_ms"].to_numpy() == pytest.approx([s * 1e3 for s in steps], rel=0.03)
    assert list(st.index[st["iter_ms"] >= 1500]) == [21]
    assert [f.rule for f in run_all(load_inputs([str(path)]))[0]] == []


def test_each_ranks_bar_is_told_apart():
    """tests/fixtures/hf_2rank_bars: both ranks print the bar, interleaved in either order. Read as one
    bar (the last display before each count's dict) the log said 775 ms for step 2 (283 ms by the
    trace) and 515 ms for step 5 (681 / 690 ms: a step diag sampled), the median 341 ms where the
    trace says 258 ms. Each display continued the bar whose times it agrees with: every step within 5%."""
    d = os.path.join(FIX, "hf_2rank_bars")
    log = import_log(os.path.join(d, "job.log")).frames["log_step"].set_index("step")
    steps = load_inputs([d]).steps
    trace = steps.groupby("step")["dur"].mean()
    both = log.join(trace, how="inner").dropna(subset=["iter_ms", "dur"])
    assert list(both.index) == list(range(2, 13))
    ratio = both["iter_ms"] / (both["dur"] / 1e6)
    assert ratio.between(0.95, 1.05).all() and abs(ratio.median() - 1) < 0.02, ratio.round(3).to_dict()


def test_two_bars_of_one_total_with_different_starts(tmp_path):
    """Two bars of one total whose first steps differ (a rank that waited 1 s longer at step 1), then
    in lockstep, their displays interleaved in changing order: each step's own time."""
    a, b = _tqdm_log([2.0, 0.5, 0.5, 3.0, 0.5, 0.5]), _tqdm_log([1.0, 0.5, 0.5, 3.0, 0.5, 0.5])
    pa, pb = a.split("\r"), b.split("\r")
    pieces = [x for k, pair in enumerate(zip(pa, pb)) for x in (pair if k % 3 else pair[::-1])]
    path = tmp_path / "job.log"
    path.write_text(TOTAL.format(6) + "\r".join(pieces) + "\n")
    st = import_log(str(path)).frames["log_step"].set_index("step")
    assert st.loc[2:, "iter_ms"].to_numpy() == pytest.approx([500.0, 500.0, 3000.0, 500.0, 500.0], rel=0.03)


def test_a_bar_without_the_start_up_block_or_dicts_is_the_training_bar(tmp_path):
    """transformers 5 prints its `***** Running training *****` block only at INFO: a run with the
    default `logging_steps` (500) over 400 steps printed no loss dict, and its log alone had no step
    at all (the trial's 400-step attach run with its dicts removed: 0 steps; with them: 400)."""
    path = tmp_path / "job.log"
    path.write_text(_tqdm_log([0.3] * 8) + "\n")
    st = import_log(str(path)).frames["log_step"].set_index("step")
    assert list(st.index) == list(range(1, 9)) and st["iter_ms"].to_numpy() == pytest.approx(
        [300.0] * 8, rel=0.03
    )
    # an evaluation bar between: the run's summary is written under the training bar, whose steps these are
    train = _tqdm_log([0.3] * 8).split("\r")
    text = "\r".join(train[:5]) + "\n" + _tqdm_log([0.1] * 3) + "\n" + "\r".join(train[5:])
    path.write_text(text + "\n{'train_runtime': 2.4, 'train_samples_per_second': 3.3, 'train_loss': 2.5}\n")
    st = import_log(str(path)).frames["log_step"].set_index("step")
    assert list(st.index) == list(range(1, 9)) and st["iter_ms"].to_numpy() == pytest.approx(
        [300.0] * 8, rel=0.03
    )


def test_another_frameworks_log_with_a_bar_keeps_its_own_steps(tmp_path):
    """A data-preparation bar in a DeepSpeed log is no training bar: its counts are no steps."""
    path = tmp_path / "job.log"
    ds = "[2024-01-01 10:00:{:02d},000] [INFO] [logging.py:96:log_dist] [Rank 0] step={}, skipped=0, lr=[1]\n"
    path.write_text(_tqdm_log([0.1] * 30) + "\n" + "".join(ds.format(s, s) for s in (10, 20, 30)))
    st = import_log(str(path)).frames["log_step"]
    assert list(st["step"]) == [10, 20, 30]


def test_a_lone_bars_displays_continue_it_as_scoring_the_choice_would():
    """`_assign` continues the one bar below a display's count without scoring (a lone bar's every
    display); the scored choice (`_best`) of that one bar gives the same bars, and a rate the bar's
    averages cannot show (dt <= 0: 0.1 s/step after 10 s/steps) gives None on both ways."""
    from diag.importers.logs.tqdm_times import Bar, _assign, _best

    bars = [Bar().after(200, 2.0)]  # a finished bar: no display below 200 continues it
    for count, rate in enumerate([1.5, 1.6, 10.0, 10.0, 0.1, 1.2], start=1):
        got = _assign(bars, count, [rate])
        free = [i for i, b in enumerate(bars) if b.n < count]
        pick = _best(bars, free, [rate], count) if free else None
        if free and pick is None:
            assert got is None
            break
        assert got is not None
        want = list(bars)
        if pick is not None:
            want[pick[0]] = bars[pick[0]].after(count, rate)  # type: ignore[assignment]
        else:
            want.append(Bar().after(count, rate))  # type: ignore[arg-type]
        assert [(b.n, b.ema_dn, b.ema_dt, b.sec, b.ms) for b in got] == [
            (b.n, b.ema_dn, b.ema_dt, b.sec, b.ms) for b in want
        ]
        bars = got
    else:
        pytest.fail("the rate the bar cannot show was not refused")
