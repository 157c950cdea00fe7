"""exposed_comm's, cross_node's and zero3_slow_link's reductions are the same computed a window of
steps at a time and merged as on the whole trace; and the rules, given the merged figures and a
trace without its per-call records, find what they find on the whole trace."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import pandas as pd
import pytest
from diag.analyzers import registered_rules
from diag.analyzers.cross_node import CrossCalls, Crossed
from diag.analyzers.exposed_comm import _Hideable, _in_tp_group, _Roles

from diag.metrics import window_metrics
from diag.metrics.exposure import Blocked, Exposed
from diag.metrics.stage import Metrics
from diag.trace.model import Trace
from diag.trace.reader import load_trace
from tests.unit.synth_trace import Job
from tests.unit.test_exposed_live_lag import FIXTURE, _as_live
from tests.unit.test_exposed_tp import MDS, _tp_job
from tests.unit.test_rules_comm import zero3_job
from tests.unit.windowing import assert_windowed, diag_folders, windows

# ZeRO-3 (over two hosts: the rule fires), TP (Megatron-DeepSpeed, Megatron-LM), PP (p2p left out),
# a straggler, embedding gathers, DDP under contention
SHAPES = {"zero3_slow_link", "zero3", "megatron_tp2", "repro_megatron_lm_healthy", "pp2_starved"}
SHAPES |= {"straggler", "embedding_heavy", "ddp_contention", "repro_mds_pipeline_bubble"}
FOLDERS = [d for d in diag_folders() if os.path.basename(d) in SHAPES]
RTOL = 1e-12  # float sums of the windows' sums, not of every call's at once: the last bits may differ
_WITHHELD = ("comm", "layer", "comm_open")


@pytest.mark.parametrize("folder", FOLDERS, ids=os.path.basename)
def test_reductions_merge_to_the_whole(folder):
    crossed, roles = _assert_merged(load_trace(folder))
    name = os.path.basename(folder)
    if name.startswith("zero3"):  # ZeRO-3's gathers, large and small, across hosts
        assert crossed[1].large and crossed[1].ops > crossed[1].large
        assert bool(crossed[0].large) is (name == "zero3_slow_link")  # two hosts there
    if name == "pp2_starved":
        assert (False, True) in roles  # send/recv: left out with pp > 1


@pytest.mark.parametrize("case", ["tp", "pp", "live"])
def test_reductions_merge_on_jobs(tmp_path, case):
    """Jobs whose calls the folders lack: tensor-parallel groups (`tp:N`), a pipeline's send/recv
    beside data-parallel calls, a live view whose leading rank's calls have no transfer time yet."""
    trace = {
        "tp": lambda: _tp_job({**MDS, "dp": 2}, tp_ms=45, dp_ms=42).write(str(tmp_path)),
        "pp": lambda: _pipeline_job().write(str(tmp_path)),
        "live": lambda: _as_live(load_trace(FIXTURE), {0: 7, 1: 10}),
    }[case]()
    _, roles = _assert_merged(trace)
    if case != "live":  # each job's calls of both kinds
        assert roles == {(case == "tp", case == "pp"), (False, False)}
    else:
        blocked = Metrics(trace).reduce(Exposed(_Hideable(False)))
        assert blocked is not None and blocked[1] is not None and len(blocked[1])  # steps left out


def _assert_merged(trace: Trace) -> tuple[list[Crossed], frozenset]:
    """Every reduction of the three rules merged over the windows equals the whole trace's; returns
    the cross-node calls' (the trace's hosts, every rank its own host) and the roles."""
    apart = tuple((r, f"host{r}") for r in sorted(trace.ranks))  # every rank a host: every group spans
    hosts = tuple(sorted(trace.hosts().items()))
    pp = int(trace.layout().get("pp") or 1) > 1
    each = (_Roles(), Exposed(_in_tp_group), Exposed(_Hideable(pp)), CrossCalls(hosts), CrossCalls(apart))
    same = (_equal, _same_blocked, _same_blocked, _same_crossed, _same_crossed)
    value = assert_windowed(trace, _Together(each), lambda a, b: [f(x, y) for f, x, y in zip(same, a, b)])
    return [value[3], value[4]], value[0]


@dataclasses.dataclass(frozen=True)
class _Together:
    """Reductions computed on the same windows (one split and one window `Metrics` for them all)."""

    each: tuple[Any, ...]

    def of(self, metrics: Metrics) -> tuple[Any, ...]:
        return tuple(r.of(metrics) for r in self.each)

    def merged(self, parts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        return tuple(r.merged([p[i] for p in parts]) for i, r in enumerate(self.each))


def _equal(a: Any, b: Any) -> None:
    assert a == b


@pytest.mark.parametrize("folder", ["zero3_slow_link", "megatron_tp2", "pp2_starved"])
def test_rules_on_the_merged_figures(folder):
    trace = load_trace(next(d for d in FOLDERS if os.path.basename(d) == folder))
    _assert_rules_windowed(trace, fires=folder == "zero3_slow_link")


@pytest.mark.parametrize(
    "job",
    [
        lambda: _tp_job({**MDS, "dp": 2}, tp_ms=45, dp_ms=42),  # both findings of exposed_comm
        lambda: zero3_job(["a", "b"], 15),  # zero3_slow_link, exposed_comm deferring to it
        lambda: zero3_job(["a", "a"], 15),  # exposed_comm on one host
        lambda: _pipeline_job(),  # pp = 2: send/recv left out
    ],
)
def test_rules_fire_alike_on_the_merged_figures(tmp_path, job):
    _assert_rules_windowed(job().write(str(tmp_path)), fires=True)


def _pipeline_job() -> Job:
    job = Job(header={"zero_stage": 1, "dtype": "fp16", "pp": 2})
    job.each_step(
        lambda r, s: [
            job.comm(r, s, op="send" if r == 0 else "recv", at_ms=5, dur_ms=40, group="pp:0"),
            job.comm(r, s, at_ms=50, dur_ms=45, group="dp:0"),
        ]
    )
    return job


def _assert_rules_windowed(trace: Trace, fires: bool) -> None:
    """exposed_comm and zero3_slow_link on the whole trace, and on a trace without its per-call
    records whose `Metrics` holds the windows' merged reductions (windows of 1 and 3 steps) and the
    figures the windowed pass gives ready-made: the same findings (float sums to RTOL)."""
    rules = {n: registered_rules()[n][0] for n in ("exposed_comm", "zero3_slow_link")}
    whole = Metrics(trace)
    want = {n: fn(trace, whole) for n, fn in rules.items()}
    assert any(want.values()) is fires
    asked = list(whole._reduced)
    bare = Trace(headers=trace.headers, frames={k: v for k, v in trace.frames.items() if k not in _WITHHELD})
    context = window_metrics.Whole.of(whole)
    for size in (1, 3):
        parts = windows(trace, size)
        m = Metrics(bare)
        for name in ("steps", "steady_steps", "median_step_s", "exposed"):
            m.__dict__[name] = getattr(whole, name)
        m._reduced.update({r: window_metrics.merged(r, parts, context) for r in asked})
        got = {n: fn(bare, m) for n, fn in rules.items()}
        assert set(m._reduced) == set(asked), "a reduction the whole trace's run did not ask for"
        for n in rules:
            assert len(got[n]) == len(want[n]), (n, size)
            for a, b in zip(want[n], got[n], strict=True):
                _close(dataclasses.asdict(a), dataclasses.asdict(b), f"{n}, windows of {size}")


def _close(a: Any, b: Any, where: str) -> None:
    """Equal, floats to RTOL."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}: {k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for x, y in zip(a, b, strict=True):
            _close(x, y, where)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=RTOL) or a == b or (math.isnan(a) and math.isnan(b)), where
    else:
        assert a == b, where


def _same_blocked(a: Blocked, b: Blocked) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    pd.testing.assert_series_equal(a[0].sort_index(), b[0].sort_index(), check_exact=True)
    assert set(a[1] if a[1] is not None else []) == set(b[1] if b[1] is not None else [])


def _same_crossed(a: Crossed, b: Crossed) -> None:
    pd.testing.assert_series_equal(a.union.sort_index(), b.union.sort_index(), check_exact=True)
    pd.testing.assert_series_equal(a.bytes, b.bytes, check_exact=True)
    assert (a.ops, a.large, a.ranks, a.modules) == (b.ops, b.large, b.ranks, b.modules)
    # whole bytes per bus factor and nanoseconds: exact in any order (`Crossed`)
    assert (a.bus, a.dur_ns, a.large_bus, a.large_xfer_ns) == (b.bus, b.dur_ns, b.large_bus, b.large_xfer_ns)
