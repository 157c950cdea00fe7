"""`JobModel`: trace events -> running aggregates, one event at a time, then `view()` for the UI.

Pure python (pandas only in `to_trace`, for the analyzers), so it is tested without textual and
stays cheap at 256 ranks: each event updates O(1) state; `view()` walks ranks and keys once.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from diag import schema
from diag.trace.model import Trace
from diag.trace.reader import capture_of
from diag.tui.state import CommStat, LayerStat, RankState
from diag.tui.tail import Chunk

MAX_RAW = 200_000  # records per kind kept for the analyzers (oldest dropped first)
OVERFLOW_KEPT = 200
OVERFLOW_STEPS_KEPT = 10_000  # steps with an overflow, kept apart from the recent loss-scale events


class JobModel:
    """Everything `diag top` shows, aggregated incrementally from tailed chunks."""

    def __init__(self) -> None:
        self.headers: dict[int, dict[str, Any]] = {}
        self._paths: dict[str, dict[str, Any]] = {}  # file -> its header (later chunks have none)
        self.ranks: dict[int, RankState] = {}
        self._min_rank: int | None = None  # whose loss scale is shown (min() per event cost O(ranks))
        self.step_max: dict[int, int] = {}  # step -> slowest rank's duration (the job's step time)
        self.step_samples: dict[int, list[int]] = defaultdict(list)
        self.comms: dict[tuple[str, str], CommStat] = {}  # every member rank's records of a group/op
        self.rank_comms: dict[int, dict[tuple[str, str], CommStat]] = defaultdict(dict)
        # layer records of steady steps, and of each rank's warm-up (its steps up to its first timed
        # one: what `diag analyze` leaves out of its top layers where a rank has a later sample)
        self.layers: dict[str, LayerStat] = {}
        self.layer_rank_steps: set[tuple[int, int]] = set()
        self.warm_layers: dict[str, LayerStat] = {}
        self.warm_rank_steps: set[tuple[int, int]] = set()
        self.overflow: deque[dict[str, Any]] = deque(maxlen=OVERFLOW_KEPT)
        # every step that overflowed (the recent-events deque above loses old ones on a long run,
        # while each rank's health keeps counting them): step -> {ranks, scale_before, scale_after}
        self.overflow_steps: dict[int, dict[str, Any]] = {}
        self.stragglers: frozenset[int] = frozenset()  # ranks the latest analysis calls stragglers
        self.state = "live"  # of a followed job: live / ended / detached (diag.tui.jobstate)
        self.loss_scale: float | None = None
        self.skipped_steps = 0
        self.gpus: dict[tuple[str, int], dict[str, Any]] = {}
        self.gpu_xids: dict[tuple[str, int], int] = {}  # Xid errors seen per GPU since start
        self.raw: dict[str, deque[dict[str, Any]]] = defaultdict(lambda: deque(maxlen=MAX_RAW))
        self.skipped_lines = 0
        self.refused: dict[str, str] = {}  # file -> why the readers refuse it (a FIFO, a device, ...)
        self.events = 0
        self.newest_ts = 0
        self.version = 0  # bumped on every change: the UI skips redraws when nothing changed
        self.capture = 0  # of the rank files read (`DirTail` follows the newest)

    # ---- ingestion ---------------------------------------------------------------------------
    def ingest(self, chunks: list[Chunk]) -> int:
        n = 0
        for chunk in chunks:
            self.skipped_lines += chunk.skipped
            if chunk.problem is not None and chunk.path not in self.refused:
                self.refused[chunk.path] = chunk.problem
                self.version += 1
            header = chunk.header
            if header is not None:
                if (capture := capture_of(chunk.path)[0]) > self.capture:
                    self._restart(capture)
                self._paths[chunk.path] = header
                if not header.get("sidecar"):
                    self._add_header(header)
            rank = self._rank_of(chunk)
            for ev in chunk.events:
                self.add(rank, ev)
                n += 1
        if n or any(c.header for c in chunks):
            self.version += 1
        return n

    def _restart(self, capture: int) -> None:
        """A later attach's files came into the directory: their records start afresh, not merged
        with the earlier capture's (the same ranks' steps would collide). The version goes on up,
        so the UI redraws."""
        version = self.version
        self.__init__()
        self.capture, self.version = capture, version + 1

    def set_stragglers(self, ranks: set[int]) -> None:
        """The straggler rule's verdict from the latest analysis (the Ranks tab shows it too)."""
        if frozenset(ranks) != self.stragglers:
            self.stragglers = frozenset(ranks)
            self.version += 1

    def set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.version += 1

    def _rank_of(self, chunk: Chunk) -> int | None:
        """The rank a file's records belong to (None for a sidecar or a file without header)."""
        h = self._paths.get(chunk.path)
        if h is None or h.get("sidecar"):
            return None
        return h.get("rank") if h.get("rank") is not None else -int(h.get("pid") or 0)

    def _add_header(self, header: dict[str, Any]) -> None:
        rank = header.get("rank")
        rank = rank if rank is not None else -int(header.get("pid") or 0)
        self.headers.setdefault(rank, dict(header))
        st = self._rank(rank)
        st.host, st.pid = header.get("host", "?"), header.get("pid")

    def _rank(self, rank: int) -> RankState:
        st = self.ranks.get(rank)
        if st is None:
            st = self.ranks[rank] = RankState(rank)
            self._min_rank = rank if self._min_rank is None else min(self._min_rank, rank)
        return st

    def add(self, rank: int | None, ev: dict[str, Any]) -> None:
        """One record of `rank` (None: a host sidecar)."""
        kind = ev.get("k")
        self.events += 1
        self.raw[kind].append({**ev, "rank": rank})
        ts = ev.get("ts")
        if isinstance(ts, int) and ts > self.newest_ts:
            self.newest_ts = ts
        if kind == schema.GPU:
            key = (str(ev.get("host", "?")), int(ev.get("index") or 0))
            self.gpus[key] = ev
            if isinstance(ev.get("xid"), list):
                self.gpu_xids[key] = self.gpu_xids.get(key, 0) + len(ev["xid"])
            return
        if rank is None:
            return
        st = self._rank(rank)
        if isinstance(ts, int):
            st.last_ts = max(st.last_ts, ts)
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, rank, st, ev)

    def _on_step(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        if ev.get("dur") is None:  # the first boundary: no duration yet
            return
        step, dur = int(ev.get("step") or 0), int(ev["dur"])
        st.add_step(step, dur)
        self.step_max[step] = max(self.step_max.get(step, 0), dur)
        if ev.get("samples") is not None:
            self.step_samples[step].append(int(ev["samples"]))
        st.samples, st.tokens = ev.get("samples"), ev.get("tokens")
        st.samples_total += int(st.samples or 0)
        st.tokens_total += int(st.tokens or 0)

    def _on_comm(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        key = (str(ev.get("group")), str(ev.get("op")))
        for table in (self.comms, self.rank_comms[rank]):
            stat = table.get(key)
            if stat is None:
                stat = table[key] = CommStat(*key)
            stat.add(rank, ev)
        step, dur = int(ev.get("step") or 0), int(ev.get("dur") or 0)
        if not schema.lone(ev.get("group_size"), ev.get("group_ranks")):  # alone in its group: moves nothing
            st.comm_ns[step] = st.comm_ns.get(step, 0) + dur
            if not ev.get("async_op"):
                st.blocked_ns[step] = st.blocked_ns.get(step, 0) + dur
                st.blocked_ns_total += dur
        st.last_comm = (key[1], key[0], int(ev.get("ts") or 0))

    def _on_layer(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        """A layer record, into the steady or the warm-up figures: a step's layers come before its
        step record, so a record of a rank's first sampled step (the first step, sampled whole)
        comes while no step of the rank is timed, or at its first timed one."""
        name, step = str(ev.get("module")), int(ev.get("step") or 0)
        warm = st.first_timed is None or step <= st.first_timed
        layers = self.warm_layers if warm else self.layers
        stat = layers.get(name)
        if stat is None:
            stat = layers[name] = LayerStat(name)
        stat.add(ev)
        (self.warm_rank_steps if warm else self.layer_rank_steps).add((rank, step))

    def _on_memory(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        peak = ev.get("peak")
        if peak is None:  # no device allocator (CPU): the process RSS against host memory
            peak = ev.get("rss")
        if peak is not None:
            st.mem_peak = max(st.mem_peak or 0, int(peak))
        now = ev.get("allocated") if ev.get("allocated") is not None else ev.get("rss")
        if now is not None:
            st.mem_allocated = int(now)
        if ev.get("capacity"):
            st.mem_capacity = int(ev["capacity"])

    def _on_overflow(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        self.overflow.append({**ev, "rank": rank})
        if ev.get("overflow"):
            st.overflows += 1
            self._keep_overflow(rank, ev)
        if ev.get("scale_after") is not None and rank == self._min_rank:
            self.loss_scale = float(ev["scale_after"])
        self.skipped_steps = max(self.skipped_steps, int(ev.get("skipped_steps") or 0))

    def _keep_overflow(self, rank: int, ev: dict[str, Any]) -> None:
        step = int(ev.get("step") or 0)
        row = self.overflow_steps.get(step)
        if row is None:
            if len(self.overflow_steps) >= OVERFLOW_STEPS_KEPT:
                del self.overflow_steps[min(self.overflow_steps)]
            row = self.overflow_steps[step] = {
                "step": step,
                "ranks": [],
                "source": ev.get("source"),
                "scale_before": ev.get("scale_before"),
                "scale_after": ev.get("scale_after"),
            }
        row["ranks"].append(rank)

    def _on_stats(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        st.dropped = sum(int(v) for v in (ev.get("dropped") or {}).values())
        st.errors = sum(int(v) for v in (ev.get("errors") or {}).values())

    def _on_meta(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        if isinstance(ev.get("key"), str):
            self.headers.setdefault(rank, {})[ev["key"]] = ev.get("value")

    # ---- outputs -----------------------------------------------------------------------------
    def snapshot(self) -> tuple[dict[int, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        """(headers, records by kind) seen so far: copied quickly under a caller's lock, turned into a
        `Trace` by `trace_of` outside it (building frames takes longer)."""
        return {r: dict(h) for r, h in self.headers.items()}, {k: list(v) for k, v in self.raw.items()}

    def to_trace(self) -> Trace:
        """What has been seen so far as a `Trace`, for `analyzers.run_all`."""
        return trace_of(*self.snapshot())


def trace_of(headers: dict[int, dict[str, Any]], by_kind: dict[str, list[dict[str, Any]]]) -> Trace:
    """A `Trace` of a `JobModel.snapshot()`, its frames built by the post-mortem reader's code."""
    from diag.trace.reader import build_frames

    return Trace(headers=headers, frames=build_frames(by_kind), sources=["diag top"])


_HANDLERS = {
    schema.STEP: JobModel._on_step,
    schema.COMM: JobModel._on_comm,
    schema.LAYER: JobModel._on_layer,
    schema.MEMORY: JobModel._on_memory,
    schema.OVERFLOW: JobModel._on_overflow,
    schema.STATS: JobModel._on_stats,
    schema.META: JobModel._on_meta,
}
