"""ZeRO-3's cross-node gathers and scatters, measured once for the rules that read them: the
premise of `zero3_slow_link`, which `exposed_comm` defers to (one fault, one finding: the exposed
time of a ZeRO-3 job over a slow link is those gathers, and the slow-link finding has the fixes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
from diag.analyzers import config, evidence

from diag.metrics.comms import bus_bandwidth, transfer_dur

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


def on_gpu(trace: Trace) -> bool:
    """Did the job run on GPUs (GPU kernels, a GPU sample, or memory recorded on a cuda device)?"""
    if not trace.gpu.empty or not trace.frame("kernel").empty:
        return True
    return any(str(d).startswith("cuda") for d in trace.memory.get("device", []))


def nominal_link_gbs(trace: Trace) -> float:
    """The bandwidth a cross-node collective should reach: a GPU job or a CPU (gloo) one."""
    return LINK_GBS_GPU if on_gpu(trace) else LINK_GBS_CPU


@dataclass
class CrossNode:
    """ZeRO-3 all-gathers / reduce-scatters on groups spanning hosts: their records (`rows`, with a
    duration and a size), their union per rank and step (`per`), the median step and cross-node time
    per step, the bus bandwidth of the large ones (`BW_BYTES`) over their transfer time (the shortest
    duration over the group: a rank's wait for a late peer is not the link's) and the nominal link's."""

    rows: pd.DataFrame
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
    c = metrics.comms
    host_of = trace.hosts()
    if c.empty or len(set(host_of.values())) < 2:
        return None
    cross = c["kind"].isin(ZERO3_OPS) & c["group_ranks"].map(lambda g: evidence.spans_hosts(g, host_of))
    per = metrics.union_per_step(cross)
    size = pd.to_numeric(c["bytes"], errors="coerce")
    rows = c[cross & (c["dur_s"] > 0) & size.notna()]
    rows = rows.assign(busbw=bus_bandwidth(rows))  # of these calls only (`comm_frame` keeps none)
    xfer = transfer_dur(c[cross]).reindex(rows.index) / 1e9
    large = rows[(size.reindex(rows.index) >= BW_BYTES) & (xfer > 0)]
    if large.empty or per.empty:  # no size recorded, or none large: the bandwidth is not measured
        return None
    busbw = float((large["busbw"] * large["dur_s"]).sum() / xfer.reindex(large.index).sum())
    return CrossNode(
        rows,
        per,
        float(per["dur_s"].median()),
        float(per["comm_s"].median()),
        busbw,
        nominal_link_gbs(trace),
    )
