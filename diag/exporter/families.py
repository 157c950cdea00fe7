"""JobModel -> Prometheus metric families, named by Prometheus' conventions (base units: seconds,
bytes, ratios; counters end in `_total`). Labels: job, rank, host; collectives add group (the process
group's name), role (tp / dp / pp / ... when the agent named it) and op; GPUs add gpu (the index).

Counters are cumulative since the rank started (the trace holds every step), so PromQL's `rate()` of
`diag_step_seconds_total` over `diag_steps_total` is the mean step time over any window.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from diag import schema
from diag.tui.model import JobModel
from diag.tui.state import RankState
from diag.tui.view import JobView, leaf_layer_rows

RANK = ("job", "rank", "host")
COMM = ("job", "rank", "host", "group", "role", "op")
GPU = ("job", "host", "gpu")
# (metric suffix, sidecar field, scale to base units, help)
GPU_GAUGES = (
    ("utilization_ratio", "util", 0.01, "GPU busy share of the last sample period (NVML)"),
    ("memory_used_bytes", "mem_used", 1, "device memory in use"),
    ("memory_total_bytes", "mem_total", 1, "device memory size"),
    ("power_watts", "power_w", 1, "power draw"),
    ("power_limit_watts", "power_limit_w", 1, "enforced power limit"),
    ("sm_clock_hertz", "sm_clock", 1e6, "SM clock"),
    ("memory_clock_hertz", "mem_clock", 1e6, "memory clock"),
    ("temperature_celsius", "temp_c", 1, "GPU temperature"),
    ("pcie_tx_bytes_per_second", "pcie_tx", 1, "PCIe transmit throughput"),
    ("pcie_rx_bytes_per_second", "pcie_rx", 1, "PCIe receive throughput"),
    ("nvlink_tx_bytes_per_second", "nvlink_tx", 1, "NVLink transmit throughput"),
    ("nvlink_rx_bytes_per_second", "nvlink_rx", 1, "NVLink receive throughput"),
    ("ecc_errors", "ecc_errors", 1, "uncorrected ECC errors the driver reports (volatile count)"),
)


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


class Families:
    """Builds each family once per scrape; `add` skips a sample without a value (absent, not 0)."""

    def __init__(self) -> None:
        self.out: dict[str, Metric] = {}

    def _family(self, cls: type, name: str, doc: str, labels: tuple[str, ...]) -> Metric:
        fam = self.out.get(name)
        if fam is None:
            fam = self.out[name] = cls(name, doc, labels=list(labels))
        return fam

    def gauge(
        self, name: str, doc: str, labels: tuple[str, ...], values: tuple[str, ...], value: Any
    ) -> None:
        fam = self._family(GaugeMetricFamily, name, doc, labels)
        if _num(value) is not None:
            fam.add_metric(list(values), _num(value))

    def counter(
        self, name: str, doc: str, labels: tuple[str, ...], values: tuple[str, ...], value: Any
    ) -> None:
        fam = self._family(CounterMetricFamily, name, doc, labels)
        if _num(value) is not None:
            fam.add_metric(list(values), _num(value))


def families(
    m: JobModel,
    view: JobView,
    job: str,
    findings: dict[tuple[str, str], int] | None,
) -> Iterator[Metric]:
    """Every metric of the job as the local trace files show it so far."""
    f = Families()
    _ranks(f, m, job)
    _collectives(f, m, job)
    _job(f, m, view, job)
    _gpus(f, m, job)
    if findings is not None:
        f.gauge(
            "diag_live_findings",
            "findings of diag's rules on what the local ranks wrote so far",
            ("job",),
            (job,),
            sum(findings.values()),
        )
        f._family(
            GaugeMetricFamily,
            "diag_findings",
            "live findings of diag's rules on the local ranks (diag analyze's rules), by rule and severity",
            ("job", "rule", "severity"),
        )
        for (rule, severity), n in sorted(findings.items()):
            f.gauge("diag_findings", "", ("job", "rule", "severity"), (job, rule, severity), n)
    yield from f.out.values()


def _ranks(f: Families, m: JobModel, job: str) -> None:
    for rank in sorted(m.ranks):
        st = m.ranks[rank]
        lv = (job, str(rank), st.host)
        last = st.last_step
        f.counter("diag_steps_total", "optimizer steps completed", RANK, lv, st.step_count)
        f.counter(
            "diag_step_seconds_total", "wall time of the completed steps", RANK, lv, st.step_ns_total / 1e9
        )
        f.gauge(
            "diag_step_duration_seconds",
            "duration of the last completed step",
            RANK,
            lv,
            last[1] / 1e9 if last else None,
        )
        f.gauge("diag_last_step", "number of the last completed step", RANK, lv, last[0] if last else None)
        f.counter(
            "diag_samples_total",
            "the job's samples per step (DeepSpeed's global_samples: the global batch, the same on "
            "every rank), summed over this rank's steps",
            RANK,
            lv,
            st.samples_total if st.samples is not None else None,
        )
        f.counter(
            "diag_tokens_total",
            "tokens the job reported per step",
            RANK,
            lv,
            st.tokens_total if st.tokens is not None else None,
        )
        f.counter(
            "diag_comm_blocking_seconds_total",
            "wall time the training thread blocked in "
            "collectives (async_op false), waiting for late ranks included",
            RANK,
            lv,
            st.blocked_ns_total / 1e9,
        )
        f.gauge(
            "diag_exposed_comm_ratio",
            "blocking collective time / step time of the last step; absent when async collectives "
            "ran in it (DDP, ZeRO overlap: the part compute hid needs diag analyze's per-layer split)",
            RANK,
            lv,
            _exposed_share(st),
        )
        f.counter(
            "diag_overflows_total", "loss-scale updates that found an overflow (fp16)", RANK, lv, st.overflows
        )
        f.gauge(
            "diag_memory_used_bytes",
            "device memory allocated at the last step (process RSS on CPU)",
            RANK,
            lv,
            st.mem_allocated,
        )
        f.gauge(
            "diag_memory_peak_bytes", "peak device memory since start (RSS on CPU)", RANK, lv, st.mem_peak
        )
        f.gauge(
            "diag_memory_capacity_bytes",
            "device memory capacity (host memory on CPU)",
            RANK,
            lv,
            st.mem_capacity,
        )
        f.counter(
            "diag_agent_dropped_events_total", "events the agent dropped (ring full)", RANK, lv, st.dropped
        )
        f.counter("diag_agent_errors_total", "collector failures the agent counted", RANK, lv, st.errors)
        f.gauge(
            "diag_last_event_timestamp_seconds",
            "time of the rank's newest record (a stale rank stops advancing)",
            RANK,
            lv,
            st.last_ts / 1e9 if st.last_ts else None,
        )


def _exposed_share(st: RankState) -> float | None:
    """The last step's blocking share, or None where async collectives ran in it: the live model
    has no compute intervals to tell how much of them was exposed (DDP's read 0.0)."""
    last = st.last_step
    if last is not None and st.comm_ns.get(last[0], 0) > st.blocked_ns.get(last[0], 0):
        return None
    return st.exposed_share()


def _role(m: JobModel, rank: int, group: str) -> str:
    groups = (m.headers.get(rank) or {}).get(schema.META_GROUPS)
    info = groups.get(group) if isinstance(groups, dict) else None
    return str(info.get("role") or "") if isinstance(info, dict) else ""


def _collectives(f: Families, m: JobModel, job: str) -> None:
    for rank in sorted(m.rank_comms):
        host = m.ranks[rank].host if rank in m.ranks else "?"
        for (group, op), c in sorted(m.rank_comms[rank].items()):
            lv = (job, str(rank), host, group, _role(m, rank, group), op)
            f.counter("diag_collectives_total", "collective and p2p calls", COMM, lv, c.count)
            f.counter("diag_collective_seconds_total", "wall time of the calls", COMM, lv, c.dur / 1e9)
            f.counter("diag_collective_bytes_total", "payload bytes of the calls", COMM, lv, c.bytes)
            f.counter(
                "diag_collective_bus_bytes_total",
                "bytes x nccl-tests bus factor of the group "
                "size: rate() over seconds' rate() is the bus bandwidth",
                COMM,
                lv,
                c.bus_bytes,
            )
            f.gauge(
                "diag_collective_busbw_bytes_per_second",
                "bus bandwidth since start (diag analyze's figure: bus bytes over total time)",
                COMM,
                lv,
                c.busbw * 1e9,
            )


def _job(f: Families, m: JobModel, view: JobView, job: str) -> None:
    lv = (job,)
    f.gauge("diag_ranks", "ranks whose trace files this exporter reads", ("job",), lv, len(m.headers))
    f.gauge(
        "diag_job_step_duration_seconds",
        "the job's step time: slowest local rank per step, mean of the last 20 steps",
        ("job",),
        lv,
        view.mean_ms / 1e3 if view.mean_ms else None,
    )
    f.gauge(
        "diag_samples_per_second",
        "global training throughput: the job's samples per step (the global batch each rank "
        "reports) over the job's step time (last 20 steps)",
        ("job",),
        lv,
        view.samples_per_s,
    )
    flops = _flops_per_step(m)
    f.gauge(
        "diag_model_flops_per_step",
        "FLOPs of one step of one rank (leaf layers, sampled steps)",
        ("job",),
        lv,
        flops,
    )
    f.gauge(
        "diag_model_flops_per_second",
        "achieved model FLOP/s of one rank: FLOPs per step over the "
        "job's step time (last 20 steps; MFU = this / the GPU's peak)",
        ("job",),
        lv,
        flops / (view.mean_ms / 1e3) if flops and view.mean_ms else None,
    )
    f.gauge("diag_loss_scale", "dynamic loss scale (fp16) after the last update", ("job",), lv, m.loss_scale)
    f.counter(
        "diag_skipped_steps_total",
        "optimizer steps skipped on overflow (the engine's count)",
        ("job",),
        lv,
        m.skipped_steps if m.overflow else None,
    )
    lay = view.layout
    info = ("job", "world_size", "tp", "pp", "dp", "zero_stage", "dtype")
    f.gauge(
        "diag_job_info",
        "the job's parallel layout (value 1)",
        info,
        (job, *(str(lay.get(k, "")) for k in info[1:])),
        1 if m.headers else None,
    )
    f.counter("diag_exporter_records_total", "trace records read", ("job",), lv, m.events)
    f.counter(
        "diag_exporter_skipped_lines_total",
        "trace lines that were not valid records",
        ("job",),
        lv,
        m.skipped_lines,
    )


def _flops_per_step(m: JobModel) -> float | None:
    rows = leaf_layer_rows(m)
    total = sum(r.gflops_per_step for r in rows) * 1e9
    return total or None


def _gpus(f: Families, m: JobModel, job: str) -> None:
    for (host, index), g in sorted(m.gpus.items()):
        lv = (job, host, str(index))
        for suffix, field, scale, doc in GPU_GAUGES:
            v = _num(g.get(field))
            f.gauge(f"diag_gpu_{suffix}", doc, GPU, lv, v * scale if v is not None else None)
        f.counter(
            "diag_gpu_xid_errors_total",
            "Xid errors in the NVML sidecar's records",
            GPU,
            lv,
            m.gpu_xids.get((host, index), 0),
        )
        throttle = g.get("throttle")
        f._family(
            GaugeMetricFamily,
            "diag_gpu_throttled",
            "1 per active clock-event (throttle) reason",
            (*GPU, "reason"),
        )
        for reason in throttle if isinstance(throttle, list) else ():
            f.gauge("diag_gpu_throttled", "", (*GPU, "reason"), (*lv, str(reason)), 1)
