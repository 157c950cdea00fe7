"""Per-rank and per-key running aggregates the model updates one event at a time (O(1) each)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from diag import schema

STEP_HISTORY = 120  # step durations kept per rank (sparkline, means)
COMM_STEPS_KEPT = 8  # steps of per-step communication time kept per rank


@dataclass
class RankState:
    rank: int
    host: str = "?"
    pid: int | None = None
    steps: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    comm_ns: dict[int, int] = field(default_factory=dict)  # step -> communication ns
    mem_peak: int | None = None
    mem_capacity: int | None = None
    last_comm: tuple[str, str, int] | None = None  # (op, group, ts)
    errors: int = 0
    dropped: int = 0
    overflows: int = 0
    last_ts: int = 0
    samples: int | None = None
    tokens: int | None = None
    # since start, for counters (`diag export --prometheus`): rates of these are the means over time
    step_count: int = 0
    step_ns_total: int = 0
    samples_total: int = 0
    tokens_total: int = 0
    blocked_ns: dict[int, int] = field(default_factory=dict)  # step -> blocking (sync) comm ns
    blocked_ns_total: int = 0
    mem_allocated: int | None = None  # the latest memory record's (device allocator, else RSS)
    first_timed: int | None = None  # the first step with a duration: the warm-up (`metrics.steps.steady`)

    def add_step(self, step: int, dur: int) -> None:
        if self.first_timed is None:
            self.first_timed = step
        self.steps.append((step, dur))
        self.step_count += 1
        self.step_ns_total += dur
        for per_step in (self.comm_ns, self.blocked_ns):
            if len(per_step) > COMM_STEPS_KEPT:
                for old in sorted(per_step)[:-COMM_STEPS_KEPT]:
                    del per_step[old]

    @property
    def last_step(self) -> tuple[int, int] | None:
        return self.steps[-1] if self.steps else None

    def comm_share(self) -> float | None:
        """Communication time / step time of the last completed step (wall clock, so async
        collectives overlapping compute can push it to 1.0, where it is capped)."""
        last = self.last_step
        if last is None or last[1] <= 0:
            return None
        return min(1.0, self.comm_ns.get(last[0], 0) / last[1])

    def exposed_share(self) -> float | None:
        """Blocking (async_op false) communication wall time / step time of the last completed step:
        the share of the step the training thread waited in collectives (waiting for late ranks
        included; async collectives, which compute may hide, left out)."""
        last = self.last_step
        if last is None or last[1] <= 0:
            return None
        return min(1.0, self.blocked_ns.get(last[0], 0) / last[1])


@dataclass
class CommStat:
    """One (process group, op): totals since start over the ranks that recorded it, and the latest
    op. Every member rank records each collective of its group: `count` and `bytes` add up the
    members' records, `per_rank_count` and `per_rank_bytes` are what the group ran."""

    group: str
    op: str
    group_size: int = 0
    count: int = 0
    bytes: int = 0
    dur: int = 0
    bus_bytes: float = 0.0  # each op's bytes x its nccl-tests factor, summed
    last_dur: int = 0
    ranks: set[int] = field(default_factory=set)  # the ranks whose records are summed here

    def add(self, rank: int, ev: dict[str, Any]) -> None:
        self.ranks.add(rank)
        self.count += 1
        nbytes = int(ev.get("bytes") or 0)
        self.bytes += nbytes
        self.last_dur = int(ev.get("dur") or 0)
        self.dur += self.last_dur
        size = int(ev.get("group_size") or 0)
        self.bus_bytes += nbytes * schema.bus_factor(self.op, size)
        self.group_size = size or self.group_size

    @property
    def busbw(self) -> float:
        """`schema.bus_bandwidth` of the ops so far: the figure `diag analyze` reports."""
        return schema.bus_bandwidth(self.bus_bytes, self.dur)

    @property
    def mean_latency(self) -> float:
        return self.dur / self.count if self.count else 0.0

    @property
    def per_rank_count(self) -> float:
        """Calls per rank (the mean over the ranks that recorded any: a live rank may lag by one)."""
        return self.count / len(self.ranks) if self.ranks else 0.0

    @property
    def per_rank_bytes(self) -> float:
        return self.bytes / len(self.ranks) if self.ranks else 0.0


@dataclass
class LayerStat:
    module: str
    fwd: int = 0
    bwd: int = 0
    flops: int = 0

    def add(self, ev: dict[str, Any]) -> None:
        dur = int(ev.get("dur") or 0)
        if ev.get("phase") in ("bwd", "backward"):
            self.bwd += dur
        else:
            self.fwd += dur
        self.flops += int(ev.get("flops") or 0)
