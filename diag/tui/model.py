"""`JobModel`: trace events -> running aggregates, one event at a time, then `view()` for the UI.

Pure python (pandas only in `to_trace`, for the analyzers), so it is tested without textual and
stays cheap at 256 ranks: each event updates O(1) state; `view()` walks ranks and keys once.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from diag import schema
from diag.trace.model import Trace
from diag.tui.state import CommStat, LayerStat, RankState
from diag.tui.tail import Chunk

MAX_RAW = 200_000  # records per kind kept for the analyzers (oldest dropped first)
OVERFLOW_KEPT = 200


class JobModel:
    """Everything `diag top` shows, aggregated incrementally from tailed chunks."""

    def __init__(self) -> None:
        self.headers: dict[int, dict[str, Any]] = {}
        self._paths: dict[str, dict[str, Any]] = {}  # file -> its header (later chunks have none)
        self.ranks: dict[int, RankState] = {}
        self.step_max: dict[int, int] = {}  # step -> slowest rank's duration (the job's step time)
        self.step_samples: dict[int, list[int]] = defaultdict(list)
        self.comms: dict[tuple[str, str], CommStat] = {}
        self.rank_comms: dict[int, dict[tuple[str, str], CommStat]] = defaultdict(dict)
        self.layers: dict[str, LayerStat] = {}
        self.layer_rank_steps: set[tuple[int, int]] = set()
        self.overflow: deque[dict[str, Any]] = deque(maxlen=OVERFLOW_KEPT)
        self.loss_scale: float | None = None
        self.skipped_steps = 0
        self.gpus: dict[tuple[str, int], dict[str, Any]] = {}
        self.raw: dict[str, deque[dict[str, Any]]] = defaultdict(lambda: deque(maxlen=MAX_RAW))
        self.skipped_lines = 0
        self.refused: dict[str, str] = {}  # file -> why the readers refuse it (a FIFO, a device, ...)
        self.events = 0
        self.newest_ts = 0
        self.version = 0  # bumped on every change: the UI skips redraws when nothing changed

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
            self.gpus[(str(ev.get("host", "?")), int(ev.get("index") or 0))] = ev
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

    def _on_comm(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        key = (str(ev.get("group")), str(ev.get("op")))
        for table in (self.comms, self.rank_comms[rank]):
            stat = table.get(key)
            if stat is None:
                stat = table[key] = CommStat(*key)
            stat.add(ev)
        step = int(ev.get("step") or 0)
        st.comm_ns[step] = st.comm_ns.get(step, 0) + int(ev.get("dur") or 0)
        st.last_comm = (key[1], key[0], int(ev.get("ts") or 0))

    def _on_layer(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        name = str(ev.get("module"))
        stat = self.layers.get(name)
        if stat is None:
            stat = self.layers[name] = LayerStat(name)
        stat.add(ev)
        self.layer_rank_steps.add((rank, int(ev.get("step") or 0)))

    def _on_memory(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        peak = ev.get("peak")
        if peak is None:  # no device allocator (CPU): the process RSS against host memory
            peak = ev.get("rss")
        if peak is not None:
            st.mem_peak = max(st.mem_peak or 0, int(peak))
        if ev.get("capacity"):
            st.mem_capacity = int(ev["capacity"])

    def _on_overflow(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        self.overflow.append({**ev, "rank": rank})
        if ev.get("overflow"):
            st.overflows += 1
        if ev.get("scale_after") is not None and rank == min(self.ranks):
            self.loss_scale = float(ev["scale_after"])
        self.skipped_steps = max(self.skipped_steps, int(ev.get("skipped_steps") or 0))

    def _on_stats(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        st.dropped = sum(int(v) for v in (ev.get("dropped") or {}).values())
        st.errors = sum(int(v) for v in (ev.get("errors") or {}).values())

    def _on_meta(self, rank: int, st: RankState, ev: dict[str, Any]) -> None:
        if isinstance(ev.get("key"), str):
            self.headers.setdefault(rank, {})[ev["key"]] = ev.get("value")

    # ---- outputs -----------------------------------------------------------------------------
    def to_trace(self) -> Trace:
        """What has been seen so far as a `Trace`, for `analyzers.run_all`."""
        from diag.trace.reader import build_frames

        by_kind = {k: list(v) for k, v in self.raw.items()}
        return Trace(headers={r: dict(h) for r, h in self.headers.items()},
                     frames=build_frames(by_kind), sources=["diag top"])


_HANDLERS = {
    schema.STEP: JobModel._on_step, schema.COMM: JobModel._on_comm,
    schema.LAYER: JobModel._on_layer, schema.MEMORY: JobModel._on_memory,
    schema.OVERFLOW: JobModel._on_overflow, schema.STATS: JobModel._on_stats,
    schema.META: JobModel._on_meta,
}
