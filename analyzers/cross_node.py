"""ZeRO-3's cross-node gathers and scatters, measured once for the rules that read them: the
premise of `zero3_slow_link`, which `exposed_comm` defers to (one fault, one finding: the exposed
time of a ZeRO-3 job over a slow link is those gathers, and the slow-link finding has the fixes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from diag.analyzers import config, evidence

from diag.metrics import bandwidth
from diag.metrics.comms import transfer_dur
from diag.metrics.steps import join_steps, union_by_step

if TYPE_CHECKING:
    from diag.metrics.stage import Metrics
    from diag.trace.model import Trace

STEP_SHARE = 0.25  # cross-node gathers/scatters take at least this share of the step
SLOW_FRACTION = 0.25  # and run below this fraction of the nominal inter-node bandwidth
LINK_GBS_GPU = 25.0  # GB/s: one 200 Gb/s NIC per GPU, the common inter-node rail
LINK_GBS_CPU = 1.25  # GB/s: 10 GbE, what a gloo/CPU job may expect between hosts
# gloo's CPUs, not the link, bound its collectives well under it: 670 KB reduce-scatters on a plain
# veth between two network namespaces of the 2-core CI host ran at 0.12-0.13 GB/s of bus bandwidth,
# over a 40 Mbit/s link 0.002 GB/s. So a CPU job's link is slow below 2% of it (0.025 GB/s)
SLOW_FRACTION_CPU = 0.02
# the bandwidth is read from transfers this large or larger: a 768-byte gather's few ms are latency
# and waiting, whatever the link (its "bus bandwidth" was 0.0001 GB/s on the plain veth)
BW_BYTES = 256 << 10
ZERO3_OPS = ("all_gather", "reduce_scatter")
MODULES = 10  # the modules a finding names, first by name


def on_gpu(trace: Trace) -> bool:
    """Did the job run on GPUs (GPU kernels, a GPU sample, or memory recorded on a cuda device)?"""
    if not trace.gpu.empty or not trace.frame("kernel").empty:
        return True
    return any(str(d).startswith("cuda") for d in trace.memory.get("device", []))


def nominal_link_gbs(trace: Trace) -> float:
    """The bandwidth a cross-node collective should reach: a GPU job or a CPU (gloo) one."""
    return LINK_GBS_GPU if on_gpu(trace) else LINK_GBS_CPU


@dataclass(frozen=True)
class Crossed:
    """ZeRO-3 all-gathers / reduce-scatters on groups spanning hosts, reduced: their union per
    (rank, step) (`union`: seconds, unjoined); of those with a duration and a size (`ops`), the bus
    bytes moved (GB: busbw x seconds) and seconds summed, the bytes per step, the ranks and the
    first modules by name; of the large ones (`BW_BYTES`, a known transfer time: `large`), the bus
    bytes and transfer seconds summed. Kept as whole numbers (bytes per bus factor, nanoseconds),
    whose sums are exact in any order, and scaled once when read: a window's sums added over the
    windows equal the whole trace's (each call's bytes x factor summed differed in the last bits)."""

    union: pd.Series
    ops: int
    bus: tuple[tuple[float, float], ...]  # (bus factor, bytes summed), by factor
    dur_ns: float
    bytes: pd.Series  # step -> bytes (every rank's)
    ranks: frozenset[int]
    modules: tuple[str, ...]  # the first MODULES by name
    large: int
    large_bus: tuple[tuple[float, float], ...]
    large_xfer_ns: float

    @property
    def moved(self) -> float:
        """Bus bytes (GB) of the calls."""
        return _gb(self.bus)

    @property
    def dur_s(self) -> float:
        return self.dur_ns / 1e9

    @property
    def large_moved(self) -> float:
        return _gb(self.large_bus)

    @property
    def large_xfer(self) -> float:
        """Transfer seconds of the large calls."""
        return self.large_xfer_ns / 1e9

    @classmethod
    def none(cls) -> Crossed:
        """Of no call (a window without any)."""
        nothing = pd.Series(dtype=float)
        return cls(nothing, 0, (), 0.0, nothing, frozenset(), (), 0, (), 0.0)

    @classmethod
    def merged(cls, parts: list[Crossed]) -> Crossed:
        """Parts of consecutive windows (their (rank, step)s apart) as one."""
        if len(parts) == 1:
            return parts[0]
        unions = [p.union for p in parts if len(p.union)]
        sizes = [p.bytes for p in parts if len(p.bytes)]
        return cls(
            union=pd.concat(unions).sort_index(kind="stable") if unions else parts[0].union,
            ops=sum(p.ops for p in parts),
            bus=_added([p.bus for p in parts]),
            dur_ns=sum(p.dur_ns for p in parts),
            bytes=pd.concat(sizes).groupby(level=0).sum() if sizes else parts[0].bytes,
            ranks=frozenset().union(*(p.ranks for p in parts)),
            modules=tuple(sorted(set().union(*(p.modules for p in parts)))[:MODULES]),
            large=sum(p.large for p in parts),
            large_bus=_added([p.large_bus for p in parts]),
            large_xfer_ns=sum(p.large_xfer_ns for p in parts),
        )


def _by_factor(factor: np.ndarray, nbytes: np.ndarray) -> tuple[tuple[float, float], ...]:
    """Bytes summed per bus factor, by factor."""
    sums = pd.Series(nbytes).groupby(factor).sum()
    return tuple((float(f), float(b)) for f, b in sums.items())


def _added(parts: list[tuple[tuple[float, float], ...]]) -> tuple[tuple[float, float], ...]:
    sums: dict[float, float] = {}
    for part in parts:
        for f, b in part:
            sums[f] = sums.get(f, 0.0) + b
    return tuple(sorted(sums.items()))


def _gb(bus: tuple[tuple[float, float], ...]) -> float:
    """Bus bytes in GB: each factor's bytes times it, rounded once."""
    return math.fsum(f * b for f, b in bus) / 1e9


@dataclass(frozen=True)
class CrossCalls:
    """`Crossed` of a trace's calls, the hosts by rank from its headers (`diag.metrics.reduction`:
    computed once for both rules, a window of steps at a time in the windowed pass)."""

    hosts: tuple[tuple[int, str], ...]

    def of(self, metrics: Metrics) -> Crossed:
        c = metrics.comms
        if c.empty:
            return Crossed.none()
        host_of = dict(self.hosts)
        cross = c["kind"].isin(ZERO3_OPS) & c["group_ranks"].map(lambda g: evidence.spans_hosts(g, host_of))
        union = union_by_step(c, keep=cross.to_numpy(dtype=bool))
        size = pd.to_numeric(c["bytes"], errors="coerce")
        rows = c[cross & (c["dur_s"] > 0) & size.notna()]
        sized = size.reindex(rows.index).to_numpy(float)
        factor = bandwidth.bus_factors(rows["kind"], rows["group_size"])  # of these calls only
        xfer = transfer_dur(c[cross]).reindex(rows.index).to_numpy(float)  # ns
        large = (sized >= BW_BYTES) & (xfer > 0)
        modules = {str(m) for m in rows["module"].dropna()} if "module" in rows else set()
        return Crossed(
            union=union,
            ops=len(rows),
            bus=_by_factor(factor, sized),
            dur_ns=float(pd.to_numeric(rows["dur"], errors="coerce").sum()),
            bytes=size.reindex(rows.index).groupby(rows["step"].to_numpy()).sum(),
            ranks=frozenset(int(r) for r in rows["rank"].unique()),
            modules=tuple(sorted(modules)[:MODULES]),
            large=int(large.sum()),
            large_bus=_by_factor(factor[large], sized[large]),
            large_xfer_ns=float(xfer[large].sum()),
        )

    def merged(self, parts: list[Crossed]) -> Crossed:
        return Crossed.merged(parts)

    folds = True  # (its merged value is a part: sums per factor in the windows' order, sets)


@dataclass
class CrossNode:
    """ZeRO-3 all-gathers / reduce-scatters on groups spanning hosts: their calls reduced (`calls`),
    their union per rank and step (`per`), the median step and cross-node time per step, the bus
    bandwidth of the large ones (`BW_BYTES`) over their transfer time (the shortest duration over
    the group: a rank's wait for a late peer is not the link's) and the nominal link's."""

    calls: Crossed
    per: pd.DataFrame
    step_s: float
    cross_s: float
    busbw: float
    link: float

    @property
    def slow(self) -> bool:
        """`zero3_slow_link`'s premise: >= STEP_SHARE of the step, below SLOW_FRACTION of a GPU job's
        link (SLOW_FRACTION_CPU of a CPU job's)."""
        share = self.cross_s / self.step_s if self.step_s > 0 else 0.0
        fraction = SLOW_FRACTION if self.link == LINK_GBS_GPU else SLOW_FRACTION_CPU
        return share >= STEP_SHARE and self.busbw < fraction * self.link


def zero3_cross_node(trace: Trace, metrics: Metrics) -> CrossNode | None:
    """The measurement, or None where it is not measured (not ZeRO-3, one host, no sizes)."""
    if config.zero_stage(trace) != 3:
        return None
    host_of = trace.hosts()
    if not metrics.calls or len(set(host_of.values())) < 2:
        return None
    calls = metrics.reduce(CrossCalls(tuple(sorted(host_of.items()))))
    per = join_steps(metrics.steady_steps, calls.union, "comm_s")
    if not calls.large or per.empty:  # no size recorded, or none large: the bandwidth is not measured
        return None
    return CrossNode(
        calls,
        per,
        float(per["dur_s"].median()),
        float(per["comm_s"].median()),
        float(calls.large_moved / calls.large_xfer),
        nominal_link_gbs(trace),
    )
