"""`Trace`: every rank's events as one pandas frame per kind, plus headers and load problems.

The same type carries what the Kineto and log importers produce (extra kinds such as `kernel`), so
analyzers take a `Trace` whatever the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diag import schema

if TYPE_CHECKING:  # imported where a frame is built: following live files needs no pandas
    import pandas as pd

# Columns whose values repeat a lot: stored as pandas categoricals (interned strings).
CATEGORICAL = (
    "module",
    "phase",
    "op",
    "dtype",
    "group",
    "device",
    "source",
    "collector",
    "where",
    "exc",
    "key",
    "name",
    "cat",
)


_EMPTY: dict[str, pd.DataFrame] = {}  # kind -> the empty frame `Trace.frame` copies
_EMPTY_LAYERS = "layer+depth"  # the empty layer frame with `Trace.layers`' columns (asked ~4 times)


@dataclass
class LoadProblem:
    """Something the reader had to skip or could not read; `str()` is the one-line message."""

    path: str
    message: str
    line: int | None = None
    truncated: bool = False

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.message}"


@dataclass(repr=False)
class Trace:
    """All ranks of one job. `headers[rank]` is that rank's header merged with its `meta` events.

    One pandas frame per record kind (`trace.steps`, `.layers`, `.comms`, ...), one row per record,
    with a `rank` column. Units, the same in every frame:
    - `ts`: integer nanoseconds since the Unix epoch (wall clock; comparable across the ranks of one
      host), `dur`: integer nanoseconds. `pd.to_datetime(df.ts)` gives datetimes, `df.dur / 1e6` ms.
    - `bytes`, `allocated`, `reserved`, `peak`, `capacity`, `rss`, `mem_delta`: bytes (integers).
    - `flops`: floating-point operations counted from the real shapes (an integer, not a rate).
    - `algbw`, `busbw`: GB/s (1e9 bytes per second; busbw with nccl-tests' factors).
    - `step`: the job's own step number (see the header's `step_origin`).
    A value a record does not hold is None / NaN, never 0; a numeric column with such gaps (the
    first step of an attach has no start) is float64, its values still whole nanoseconds / bytes.
    """

    headers: dict[int, dict[str, Any]] = field(default_factory=dict)
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    problems: list[LoadProblem] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def frame(self, kind: str) -> pd.DataFrame:
        """The frame of one kind, with at least the schema's columns (empty if none recorded)."""
        df = self.frames.get(kind)
        if df is not None:
            return df
        empty = _EMPTY.get(kind)
        if empty is None:
            import pandas as pd

            cols = ["rank", *schema.FIELDS.get(kind, ())]
            empty = _EMPTY[kind] = pd.DataFrame({c: pd.Series(dtype="object") for c in cols})
        # a shallow copy: a caller adding a column changes its copy only (building a frame of
        # object Series anew costs ~2 ms, and the rules and report ask for absent kinds ~40 times)
        return empty.copy(deep=False)

    def __repr__(self) -> str:
        """One line: a trace's frames hold up to millions of rows, never printed whole."""
        rows = ", ".join(f"{kind} {len(df):,}" for kind, df in sorted(self.frames.items()) if len(df))
        problems = f", {len(self.problems)} problem(s)" if self.problems else ""
        where = ", ".join(self.sources) or "?"
        return f"<diag.Trace {len(self.headers)} rank(s) from {where}: {rows or 'no records'}{problems}>"

    @property
    def ranks(self) -> list[int]:
        """The ranks that wrote a header, ascending (a rank unknown to its writer: minus its pid)."""
        return sorted(self.headers)

    @property
    def steps(self) -> pd.DataFrame:
        """One row per optimizer step and rank: step, ts, dur (ns), samples, tokens, applied (False:
        the step was skipped, an fp16 overflow)."""
        return self.frame(schema.STEP)

    @property
    def layers(self) -> pd.DataFrame:
        """One row per module, phase (forward / backward) and sampled step: module, phase, ts, dur
        (ns), flops, mem_delta (bytes; CUDA only), plus `depth` (0: the model's root, 1: its
        children, ...) and `leaf` (no recorded module inside it: its time and flops are its own,
        while a parent's include its children's)."""
        df = self.frame(schema.LAYER)
        if "leaf" not in df.columns and "module" in df.columns:
            if schema.LAYER not in self.frames:  # none recorded: the one empty frame, made once
                if _EMPTY_LAYERS not in _EMPTY:
                    _EMPTY[_EMPTY_LAYERS] = _with_depth_and_leaf(df)
                return _EMPTY[_EMPTY_LAYERS].copy(deep=False)
            df = self.frames[schema.LAYER] = _with_depth_and_leaf(df)
        return df

    @property
    def comms(self) -> pd.DataFrame:
        """One row per collective or p2p call: op, bytes, dtype, group (the process group's role:
        tp, dp, pp, ..., or its number), group_size, group_ranks, ts, dur (ns), module (the one
        running when it was issued), async_op, algbw and busbw (GB/s)."""
        return self.frame(schema.COMM)

    @property
    def memory(self) -> pd.DataFrame:
        """One row per step and rank: device, allocated, reserved, peak, capacity (device bytes,
        None without a device allocator) and rss (host process bytes)."""
        return self.frame(schema.MEMORY)

    @property
    def overflow(self) -> pd.DataFrame:
        """One row per loss-scale update or non-finite check: overflow (bool), scale_before,
        scale_after, skipped_steps (so far), source (the framework's scaler that reported it)."""
        return self.frame(schema.OVERFLOW)

    @property
    def errors(self) -> pd.DataFrame:
        """Collector failures the agent counted instead of raising into the job: collector, where,
        exc, message, count."""
        return self.frame(schema.ERROR)

    @property
    def stats(self) -> pd.DataFrame:
        """The agent's own health over time: events captured / dropped / failed per collector."""
        return self.frame(schema.STATS)

    @property
    def gpu(self) -> pd.DataFrame:
        """NVML samples of the GPU sidecar (python -m diag.nvml): util (%), memory, power (W),
        clocks (MHz), temperature (C), throttle reasons, PCIe / NVLink rates, ECC, Xid."""
        return self.frame(schema.GPU)

    @property
    def proc(self) -> pd.DataFrame:
        """`diag watch`'s looks at each rank's process (`of_rank`), summed per second: looks,
        stopped (seen in state T), resumes, first_stop / last_stop (ns)."""
        return self.frame(schema.PROC)

    @property
    def sched(self) -> pd.DataFrame:
        """Each rank's training thread: CPU time and run-queue wait (`cpu`, `runq`), cumulative ns
        from the kernel's schedstat, sampled by the agent's writer thread."""
        return self.frame(schema.SCHED)

    @property
    def truncated(self) -> list[LoadProblem]:
        return [p for p in self.problems if p.truncated]

    def layout(self) -> dict[str, Any]:
        """The job's layout as the headers agree on it (from the lowest rank that knows)."""
        out: dict[str, Any] = {}
        groups: dict[str, Any] = {}  # every rank's process groups by name (role, size, ranks)
        for rank in self.ranks:
            for k in schema.HEADER_KEYS:
                if k not in out and self.headers[rank].get(k) is not None:
                    out[k] = self.headers[rank][k]
            seen = self.headers[rank].get("groups")
            if isinstance(seen, dict):
                # a bare entry the agent renamed later is that group's old name: the records carry the new
                groups.update({k: v for k, v in seen.items() if k not in groups and not _renamed(v)})
        if groups:
            out["groups"] = dict(sorted(groups.items()))
        # ranks that counted steps from their own attach, renumbered onto one (`trace.step_align`)
        key = schema.STEP_OFFSET
        shifted = {str(r): h[key] for r, h in self.headers.items() if h.get(key)}
        if shifted:
            out["step_offsets"] = shifted
        return out

    def hosts(self) -> dict[int, str]:
        """rank -> host name from the headers ("?" where a header does not say)."""
        return {r: str(h.get("host") or "?") for r, h in self.headers.items()}


def _renamed(group: Any) -> bool:
    return isinstance(group, dict) and group.get("renamed") is not None


def _with_depth_and_leaf(df: pd.DataFrame) -> pd.DataFrame:
    """`depth` and `leaf` columns of a layer frame (computed once per module name, not per row).
    The collector names a model's root by its class (`GPTModel`, `DeepSpeedEngine`) and its
    children without that prefix (`decoder.layers.0`): a dotless CamelCase name among others is the
    root, depth 0 and no leaf, and the other names are one level below it."""
    names = [str(n) for n in df["module"].dropna().unique()]
    roots = {n for n in names if "." not in n and n[:1].isupper()} if len(names) > 1 else set()
    parents = roots | {n.rsplit(".", k)[0] for n in names for k in range(1, n.count(".") + 1)}
    below = 1 if roots else 0
    depth = {n: 0 if n in roots else n.count(".") + below for n in names}
    module = df["module"].astype(object).map(lambda n: None if n is None else str(n))
    return df.assign(
        depth=module.map(depth).astype("Int64"),
        leaf=module.map(lambda n: n is not None and n not in parents).astype(bool),
    )
